"""Package discovery only: maps the `integrations/` folder to the `gem_integrations` import package."""

from setuptools import find_packages, setup


def _packages(folder: str, name: str) -> list[str]:
    return [name] + [f"{name}.{sub}" for sub in find_packages(folder)]


setup(
    packages=_packages("gem_core", "gem_core") + _packages("integrations", "gem_integrations"),
    package_dir={"gem_core": "gem_core", "gem_integrations": "integrations"},
    package_data={"gem_core": ["py.typed", "data/*"]},
)
