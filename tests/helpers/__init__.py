"""What the repository's own tests share and a user testing their own env never needs (those helpers stay in
gem_core.testing): :mod:`.scripts` (a script under benchmarks/ loaded as a module, the cross-framework arms' checks,
what a written launch script hands its trainer), :mod:`.real` (the real tier's model, engine bounds and logprobs),
:mod:`.lifecycle` (counting envs made and closed, through pytest's monkeypatch).

Importable as ``helpers`` in every nox session: pytest puts tests/ on ``sys.path`` (tests/conftest.py is the
root conftest of every session's folder). A file that runs as a script (a subprocess driver) puts tests/ there
itself first.
"""
