"""The ``gem-core`` command: list env ids, play an env by hand, or run a policy over a vector env.

Examples::

    gem-core list --category game
    gem-core play game:GuessTheNumber-v0-hard                      # you play, in the terminal
    gem-core play game:Sudoku-v0-easy --policy oracle --seed 3     # watch the oracle play one episode
    gem-core play game:Wordle-v0-easy --policy random --num-envs 64 --episodes 256 --vector async
    gem-core make-dataset verl --env game:Sudoku-v0-easy --n 1024 --out train.parquet   # a trainer's dataset
    gem-core experiment examples/experiments/portable.toml --trainer verl --out run.sh  # a trainer's config of a run
    gem-core openrlhf train --train.agent_func_path $(gem-core openrlhf agent-path) --algo.advantage.estimator rebn ...

Only the ``gem-core`` script imports this module, so ``import gem_core`` does not pay for argparse.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import gem_core
from gem_core.cli_support import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, CliError, check_out_file, os_error_text, seconds, whole_number
from gem_core.errors import GemError, InvalidArgumentError, UnknownEnvError
from gem_core.serve import (  # constants only: openenv is imported when serving
    DEFAULT_BODY_TIMEOUT,
    DEFAULT_HEADER_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_ACTION_CHARS,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_SESSIONS,
    MAX_SESSIONS_LIMIT,
    TOKEN_ENV,
)
from gem_core.vector.make import MAX_NUM_ENVS
from gem_core.play import cmd_play


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``gem-core`` command."""
    parser = argparse.ArgumentParser(
        prog="gem-core",
        description="GEM-style multi-turn text environments: list them, play them, benchmark them.",
    )
    parser.add_argument("--version", action="version", version=f"gem-core {gem_core.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    listing = commands.add_parser("list", help="list registered env ids, grouped by category")
    listing.add_argument("--category", help="only this category (e.g. 'game')")

    play = commands.add_parser(
        "play",
        help="play an env: yourself, or watch/benchmark a random or oracle policy",
        description=(
            "Play one episode of ENV_ID in the terminal (--policy human, the default), or watch a random/oracle "
            "policy play it. With --num-envs or --episodes, run the policy over a vector env until that many "
            "episodes have finished and print a summary (rates are per episode; steps/s counts env turns, "
            "timed from after the first reset)."
        ),
    )
    play.add_argument("env_id", metavar="ENV_ID", help="an id from `gem-core list`, e.g. game:GuessTheNumber-v0-hard")
    play.add_argument("--seed", type=whole_number(0), default=None, help="reset seed (default: random for one episode, 0 for a batch)")
    play.add_argument(
        "--policy",
        choices=("human", "random", "oracle"),
        default=None,
        help="who acts: human (default for one episode), random (default for a batch), oracle (envs with oracle_action)",
    )
    batch = play.add_argument_group("batch mode (a vector env; turned on by --num-envs or --episodes)")
    batch.add_argument("--num-envs", type=whole_number(1, MAX_NUM_ENVS), default=None, help="envs stepped together (default 1)")
    batch.add_argument("--episodes", type=whole_number(1), default=None, help="finished episodes to collect (default: num-envs)")
    batch.add_argument(
        "--vector", choices=("sync", "async", "ray"), default="sync", help="sync: one process; async: worker processes; ray: Ray actors (the ray extra)"
    )
    batch.add_argument("--no-progress", action="store_true", help="no progress bar (it is also off when stdout is not a terminal)")

    serve = commands.add_parser(
        "serve-search",
        help="serve a BM25 index of a JSONL corpus over the Search-R1 /retrieve API",
        description=(
            "Build a BM25 index (bm25s; pip install -e '.[search]') from a JSONL corpus of "
            '{"id", "title", "text"} records and answer POST /retrieve (Search-R1/GEM retrieval API), '
            "so that many env workers share one index: SearchTool(url='http://HOST:PORT')."
        ),
    )
    serve.add_argument("--corpus", required=True, help="JSONL file, one {id, title, text} record a line")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=whole_number(0, 65535), default=8000, help="port (default 8000; 0 picks a free one)")
    serve.add_argument("--topk", type=whole_number(1), default=3, help="passages per query when a request gives no topk")

    served = commands.add_parser(
        "serve",
        help="serve env ids over OpenEnv's protocol (HTTP and WebSocket sessions; the openenv extra)",
        description=(
            "Serve ENV_IDs with OpenEnv's own server (pip install -e '.[openenv]'): each WebSocket session (/ws) "
            'gets its own env, reset takes seed and options, a step takes {"action": TEXT}. OpenEnv\'s '
            "GenericEnvClient(base_url=URL) plays it. Several ids are served under /ENV_ID each. Ctrl-C stops."
        ),
    )
    served.add_argument("env_ids", nargs="+", metavar="ENV_ID", help="ids from `gem-core list`, e.g. game:GuessTheNumber-v0")
    served.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1, this machine only; any other needs --token or --insecure)"
    )
    served.add_argument("--port", type=whole_number(0, 65535), default=8000, help="port (default 8000; 0 picks a free one)")
    served.add_argument(
        "--token",
        default=None,
        help=f"the token every client must send as 'Authorization: Bearer TOKEN' (default: ${TOKEN_ENV}, else none); needed off loopback",
    )
    served.add_argument("--insecure", action="store_true", help="serve off loopback without a token: anyone who reaches the port plays (and runs code)")
    served.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a web origin (scheme://host[:port]) whose pages may use the server; repeatable (default: a browser's request is refused)",
    )
    served.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a DNS name clients reach the server by, besides localhost and IP addresses; repeatable (checked without a token, against DNS rebinding)",
    )
    served.add_argument(
        "--max-action-chars",
        type=whole_number(1, 16 * 1024 * 1024),
        default=DEFAULT_MAX_ACTION_CHARS,
        help=f"the longest action a step takes (default {DEFAULT_MAX_ACTION_CHARS}); a longer one is one error line, the session kept",
    )
    served.add_argument(
        "--max-connections",
        type=whole_number(2, 1_000_000),
        default=DEFAULT_MAX_CONNECTIONS,
        help=f"open connections kept at most (default {DEFAULT_MAX_CONNECTIONS}, fewer under a low file-descriptor limit); the next is closed",
    )
    served.add_argument(
        "--header-timeout",
        type=seconds,
        default=DEFAULT_HEADER_TIMEOUT,
        help=f"seconds a connection has to send a request's headers (default {DEFAULT_HEADER_TIMEOUT:g})",
    )
    served.add_argument(
        "--body-timeout", type=seconds, default=DEFAULT_BODY_TIMEOUT, help=f"seconds an HTTP request has to send its body (default {DEFAULT_BODY_TIMEOUT:g})"
    )
    served.add_argument(
        "--max-sessions",
        type=whole_number(1, MAX_SESSIONS_LIMIT),
        default=DEFAULT_MAX_SESSIONS,
        help=f"sessions each id holds at once (default {DEFAULT_MAX_SESSIONS}); the next one is refused with CAPACITY_REACHED",
    )
    served.add_argument(
        "--idle-timeout",
        type=seconds,
        default=DEFAULT_IDLE_TIMEOUT,
        help=f"close a WebSocket session (and its env) with no message for this many seconds (default {DEFAULT_IDLE_TIMEOUT:g})",
    )
    served.add_argument("--env-kwargs", default="{}", help="JSON object of make() kwargs for every id, e.g. '{\"max_turns\": 20}'")
    served.add_argument("--tools", default="", help="comma-separated tools to wrap each env with: python, search")

    from gem_core.train import cli as train_cli  # argparse only; torch is imported when a run starts

    train_cli.add_arguments(commands.add_parser("train", help=train_cli.HELP, description=train_cli.DESCRIPTION))

    from gem_core.eval import cli as eval_cli  # `gem-core eval ENV_ID...` means `gem-core eval run ENV_ID...`

    eval_cli.add_arguments(commands.add_parser("eval", help=eval_cli.HELP, description=eval_cli.DESCRIPTION))

    plugins = discover()
    datasets = commands.add_parser("make-dataset", help="write a trainer's dataset file of env episodes (e.g. verl parquet)")
    trainers = datasets.add_subparsers(dest="trainer", metavar="TRAINER")
    trainers.required = True
    for plugin in plugins.values():
        if plugin.dataset:
            _add_dataset_builder(trainers, plugin.name, plugin.dataset)
    experiments = commands.add_parser(
        "experiment",
        help="write a trainer's own configuration of an experiment file (docs/experiments.md)",
        description="Write the configuration that runs the experiment FILE in TRAINER: its dataset commands and its own "
        "config (verl's hydra overrides, OpenRLHF's and oat's arguments, TRL's GRPOConfig script, RL2's overrides, ROLL's yaml), "
        "every setting mapped and the trainer's own defaults that would change the run pinned. A setting the trainer cannot "
        "express is refused in one line naming it. `gem-core train --experiment FILE` runs it in the reference trainer.",
    )
    experiments.add_argument("file", metavar="FILE", help="the experiment file (TOML)")
    writers = sorted(name for name, plugin in plugins.items() if plugin.experiment and _plugin_module(plugin.experiment) is not None)
    experiments.add_argument("--trainer", required=True, choices=writers, help="the trainer whose configuration to write")
    experiments.add_argument("--out", default=None, help="file to write (default: standard output)")
    for plugin in plugins.values():
        if plugin.commands:
            module = _plugin_module(plugin.commands)
            if module is not None:
                sub = commands.add_parser(plugin.name, help=plugin.description or f"{plugin.name} plugin commands")
                module.add_arguments(sub)
                sub.set_defaults(plugin_main=module.main)
    return parser


# Trainer plugins come from the `gem_core.plugins` entry-point group (gem_core.plugins.discover): each
# descriptor names its `make-dataset` module (`add_arguments(parser)`, `main(args) -> int`; its
# docstring's first line is the help text) and its `gem-core NAME ...` commands module, if any.
def discover() -> dict[str, Any]:
    from gem_core.plugins import discover as discover_plugins

    return discover_plugins()


def _plugin_module(module_name: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module_name)
    except ImportError:  # that integration is not shipped in this install
        return None


def _add_dataset_builder(trainers: Any, trainer: str, module_name: str) -> None:
    module = _plugin_module(module_name)
    if module is None:
        return
    summary = (module.__doc__ or trainer).strip().splitlines()[0]
    sub = trainers.add_parser(trainer, help=summary, description=module.__doc__)
    module.add_arguments(sub)
    sub.set_defaults(dataset_main=module.main)


def cmd_make_dataset(args: argparse.Namespace) -> int:
    """Run the chosen trainer's dataset builder; its ValueErrors and OSErrors are usage errors. ``--out``
    is checked first: a file in a directory that exists (nothing is created anywhere else)."""
    if getattr(args, "out", None) is not None:
        check_out_file(args.out)
    try:
        return int(args.dataset_main(args))
    except ValueError as err:
        raise CliError(str(err)) from None
    except OSError as err:
        written = getattr(err, "filename", None) and os.path.dirname(os.path.abspath(err.filename)) == os.path.dirname(os.path.abspath(args.out))
        raise CliError(f"--out {args.out}: cannot write it: {err.strerror or err}" if written else os_error_text(err)) from None


def cmd_experiment(args: argparse.Namespace, out: TextIO) -> int:
    """Write ``--trainer``'s configuration of the experiment file (its module's ``render``); a bad file, an
    unknown env id and a setting the trainer cannot express are one line each."""
    from gem_core.experiment import load_experiment

    if args.out is not None:
        check_out_file(args.out)
    experiment = load_experiment(args.file)
    for env_id in experiment.env_ids:
        gem_core.spec(env_id)  # an unknown id fails here with the registry's suggestion
    text = _plugin_module(discover()[args.trainer].experiment).render(experiment, source=args.file)
    if args.out is None:
        out.write(text)
        return 0
    try:
        with open(args.out, "w", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as err:
        raise CliError(f"--out {args.out}: cannot write it: {err.strerror or err}") from None
    print(f"wrote {args.trainer}'s configuration of {args.file} to {args.out}", file=sys.stderr)
    return 0


def _passthrough(argv: list[str]) -> Any:
    """A plugin command that takes the rest of the command line untouched (its module's ``PASSTHROUGH``
    maps action names to ``fn(argv) -> int``), or None. argparse's REMAINDER cannot take arguments
    that start with ``--`` inside a subcommand."""
    if len(argv) < 2 or argv[0].startswith("-"):
        return None
    plugin = discover().get(argv[0])
    if plugin is None or not plugin.commands:
        return None
    module = _plugin_module(plugin.commands)
    return None if module is None else getattr(module, "PASSTHROUGH", {}).get(argv[1])


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``gem-core`` command with ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    from gem_core.eval.cli import with_default_action

    argv = with_default_action(sys.argv[1:] if argv is None else argv)
    passthrough = _passthrough(argv)
    if passthrough is not None:  # e.g. `gem-core openrlhf train ...`: everything after it is the trainer's
        try:
            return passthrough(argv[2:])
        except BrokenPipeError:  # e.g. `gem-core openrlhf train --help | head`
            return _reader_left()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse exits on --help/--version/bad usage; main returns codes instead
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    try:
        if args.command == "list":
            return cmd_list(args.category, sys.stdout)
        if args.command == "train":
            from gem_core.train import cli as train_cli

            return train_cli.main(args, sys.stdout)
        if args.command == "eval":
            from gem_core.eval import cli as eval_cli

            return eval_cli.main(args, sys.stdout)
        if args.command == "serve-search":
            return cmd_serve_search(args, sys.stdout)
        if args.command == "serve":
            return cmd_serve(args, sys.stdout)
        if args.command == "make-dataset":
            return cmd_make_dataset(args)
        if args.command == "experiment":
            return cmd_experiment(args, sys.stdout)
        if getattr(args, "plugin_main", None) is not None:
            return int(args.plugin_main(args))
        return cmd_play(args, sys.stdout)
    except (CliError, UnknownEnvError, InvalidArgumentError) as err:
        print(f"gem-core: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except GemError as err:
        print(f"gem-core: error: {err}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. `gem-core list | head`: the reader left; that is not an error
        return _reader_left()


def _reader_left() -> int:
    """stdout's reader has gone: send what is still buffered to /dev/null (so that Python's exit does not
    fail on it) and end quietly."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_OK


# -- list ------------------------------------------------------------------------------------------


def cmd_list(category: str | None, out: TextIO) -> int:
    """Print the registered ids grouped by category, each with its spec's description."""
    ids = gem_core.list_envs(category)
    if not ids:
        categories = sorted({gem_core.spec(i).category for i in gem_core.list_envs()})
        raise CliError(f"no envs in category {category!r}; categories: {', '.join(categories) or '(none)'}")
    groups: dict[str, list[str]] = {}
    for env_id in ids:
        groups.setdefault(gem_core.spec(env_id).category, []).append(env_id)
    width = max(map(len, ids))
    blocks = []
    for name, members in groups.items():
        lines = [f"{name} ({len(members)} env{'s' if len(members) != 1 else ''})"]
        lines += [f"  {env_id:<{width}}  {gem_core.spec(env_id).description}".rstrip() for env_id in members]
        blocks.append("\n".join(lines))
    aliases = _aliases(set(ids))
    if aliases:
        alias_width = max(map(len, aliases))
        lines = ["aliases"] + [f"  {alias:<{alias_width}}  -> {target}" for alias, target in sorted(aliases.items())]
        blocks.append("\n".join(lines))
    print("\n\n".join(blocks), file=out)
    return EXIT_OK


def _aliases(targets: set[str]) -> dict[str, str]:
    from gem_core import registry

    table: dict[str, str] = getattr(registry, "alias_table", {})
    return {alias: target for alias, target in table.items() if target in targets}


# -- serve-search ----------------------------------------------------------------------------------


def cmd_serve_search(args: argparse.Namespace, out: TextIO) -> int:
    """``gem-core serve-search``: one shared BM25 index over HTTP, until interrupted."""
    from gem_core.tools.search import BM25Index, SearchError, make_search_server

    try:
        index = BM25Index.from_jsonl(args.corpus)
    except SearchError as err:
        raise CliError(str(err)) from None
    try:
        server = make_search_server(index, args.host, args.port, default_topk=args.topk)
    except OSError as err:  # the port is taken, the address is not this machine's, the name does not resolve
        raise CliError(f"cannot listen on {args.host}:{args.port}: {err.strerror or err}") from None
    host, port = server.server_address[:2]
    print(f"serving {len(index)} documents from {args.corpus} at http://{host}:{port}/retrieve", file=out, flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return EXIT_OK


# -- serve -----------------------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace, out: TextIO) -> int:
    """``gem-core serve``: env ids over OpenEnv's protocol until Ctrl-C or SIGTERM, then a clean stop."""
    import signal

    from gem_core.serve import TOKEN_ENV, require_openenv
    from gem_core.tasks import parse_env_kwargs

    try:
        env_kwargs = parse_env_kwargs(args.env_kwargs)
    except ValueError as err:
        raise CliError(f"--env-kwargs: {err}") from None
    require_openenv()
    from gem_core.serve.server import EnvServer, ServeError

    server = EnvServer(
        args.env_ids,
        host=args.host,
        port=args.port,
        env_kwargs=env_kwargs,
        tools=args.tools or None,
        max_sessions=args.max_sessions,
        idle_timeout=args.idle_timeout,
        token=args.token if args.token is not None else (os.environ.get(TOKEN_ENV) or None),
        insecure=args.insecure,
        max_action_chars=args.max_action_chars,
        max_connections=args.max_connections,
        header_timeout=args.header_timeout,
        body_timeout=args.body_timeout,
        allow_origins=args.allow_origin,
        allow_hosts=args.allow_host,
    )
    try:
        server.start()
    except ServeError as err:
        raise CliError(str(err)) from None
    for env_id in args.env_ids:
        print(f"serving {env_id} at {server.url(env_id)} (OpenEnv: GenericEnvClient(base_url=...), WebSocket /ws)", file=out, flush=True)
    print(server.security_line(), file=out, flush=True)

    def stop(*_: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        server.run_forever()
    except KeyboardInterrupt:
        server.stop()
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(f"stopped: {server.envs_built} envs built, {server.envs_closed} closed", file=out, flush=True)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
