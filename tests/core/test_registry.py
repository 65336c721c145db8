"""Registry: ids, aliases, kwargs checking, clear errors, and third-party entry-point plugins."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import gem_core
from gem_core.errors import RegistrationError, UnknownEnvError, UnknownKwargError
from gem_core.envs.games import GAME_NAMES
from gem_core.registry import EnvFactory, registry


def test_every_game_has_the_gem_variants():
    ids = set(gem_core.list_envs("game"))
    for name in GAME_NAMES:
        for variant in ("-v0", "-v0-easy", "-v0-hard", "-v0-random"):
            assert f"game:{name}{variant}" in ids
    assert len(GAME_NAMES) == 12


def test_unknown_id_suggests_close_matches():
    with pytest.raises(UnknownEnvError) as err:
        gem_core.make("game:Sudoku-v0-eazy")
    assert "game:Sudoku-v0-easy" in str(err.value)
    assert isinstance(err.value, KeyError)  # callers that catch KeyError keep working


def test_unknown_id_without_close_match_points_to_list():
    with pytest.raises(UnknownEnvError, match="gem-core list"):
        gem_core.spec("zzz:Nothing-v9")


def test_unknown_kwarg_is_rejected_with_suggestion():
    with pytest.raises(UnknownKwargError) as err:
        gem_core.make("game:GuessTheNumber-v0-easy", max_turn=3)
    msg = str(err.value)
    assert "max_turn" in msg and "Did you mean: max_turns" in msg and "It accepts:" in msg
    assert isinstance(err.value, TypeError)


def test_kwargs_override_defaults_and_land_in_spec():
    env = gem_core.make("game:GuessTheNumber-v0-easy", max_turns=2)
    assert env.unwrapped.max_turns == 2
    assert env.spec.kwargs["max_turns"] == 2 and env.spec.kwargs["max_number"] == 10
    assert env.spec.id == "game:GuessTheNumber-v0-easy"


def test_register_rejects_bad_ids_duplicates_and_entry_points():
    with pytest.raises(RegistrationError, match="category:Name"):
        gem_core.register("NoCategory-v0", "x:y")
    with pytest.raises(RegistrationError, match="already registered"):
        gem_core.register("game:Sudoku-v0-easy", "x:y")
    with pytest.raises(RegistrationError, match="package.module:ClassName"):
        gem_core.register("test:BadEntry-v0", "no_colon_here")


def test_alias_resolves_and_make_uses_target():
    gem_core.register_alias("test:GTN-alias-v0", "game:GuessTheNumber-v0-easy", override=True)
    env = gem_core.make("test:GTN-alias-v0")
    assert env.spec.id == "game:GuessTheNumber-v0-easy"
    with pytest.raises(RegistrationError, match="unknown id"):
        gem_core.register_alias("test:x-v0", "game:Nope-v0")


def test_register_with_aliases_only_touches_its_own_aliases():
    gem_core.register("test:AliasA-v0", "gem_core.envs.games.guess_the_number:GuessTheNumber", aliases=["test:A-v0"], override=True)
    gem_core.register("test:AliasB-v0", "gem_core.envs.games.guess_the_number:GuessTheNumber", aliases=["test:B-v0"], override=True)
    assert gem_core.spec("test:A-v0").id == "test:AliasA-v0"
    assert gem_core.spec("test:B-v0").id == "test:AliasB-v0"


def test_entry_point_returning_non_env_is_a_clear_error():
    gem_core.register("test:NotAnEnv-v0", "collections:OrderedDict", override=True)
    with pytest.raises(RegistrationError, match="not a gem_core Env"):
        gem_core.make("test:NotAnEnv-v0")
    del registry["test:NotAnEnv-v0"]


def test_env_factory_pickles_and_builds_without_registry_lookup():
    import pickle

    spec = gem_core.spec("game:GuessTheNumber-v0-easy")
    factory = pickle.loads(pickle.dumps(EnvFactory(spec, (), {"max_turns": 3})))
    env = factory()
    assert env.unwrapped.max_turns == 3


def test_third_party_plugin_registers_through_entry_points(tmp_path):
    """A real distribution (dist-info on sys.path) exposing the gem_core.envs group is discovered."""
    (tmp_path / "fake_gem_plugin.py").write_text(
        textwrap.dedent("""
        import gem_core
        from gem_core.envs.games.guess_the_number import GuessTheNumber

        class Tiny(GuessTheNumber):
            pass

        def register_envs():
            gem_core.register("plugin:Tiny-v0", "fake_gem_plugin:Tiny", min_number=1, max_number=3, max_turns=2)
    """)
    )
    dist = tmp_path / "fake_gem_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-gem-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[gem_core.envs]\ntiny = fake_gem_plugin:register_envs\n")
    code = (
        "import gem_core\n"
        "env = gem_core.make('plugin:Tiny-v0')\n"
        "obs, _ = env.reset(seed=0)\n"
        "assert 'between 1 and 3' in obs, obs\n"
        "assert 'plugin:Tiny-v0' in gem_core.list_envs('plugin')\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env={"PYTHONPATH": str(tmp_path), "PATH": ""}, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_import_is_light():
    # what keeps `import gem_core` fast: none of the heavy modules come with it (its time is a benchmark's
    # business, not a test's: CI's loaded machine made a 1 s bound flaky)
    code = "import sys\nimport gem_core\nprint([m for m in ('torch', 'transformers', 'ray', 'english_words', 'gem_core.cli') if m in sys.modules])\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr
