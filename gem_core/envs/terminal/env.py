"""TerminalEnv: a task solved with shell commands, in a persistent bash inside the bubblewrap sandbox.

One episode is one task of :mod:`.tasks` (``task=`` picks one; otherwise the reset seed draws it), its
files, numbers and checker inputs drawn from the reset seed too. Each action is one command in a
```` ```bash ```` block (or ``<bash>...</bash>``); the observation is its output (stdout and stderr
together, at most ``max_output_bytes``, head and tail) and exit code. The shell
persists across turns (cwd, variables, background jobs), in a private ``/app`` holding the task's files.
``submit`` (or ``done``) ends the episode; so does the turn limit (``truncated``). Either way every
process of the agent's is killed, then the sandbox's supervisor evaluates the task's checks (sent only
then): all passing is success.

Rewards: ``success_reward`` (1) when the checker passes at the end, else 0; ``format_error_reward``
(-0.1) for a reply without a command (the episode goes on: the turn is spent); ``timeout_reward`` (-0.1)
for a command that runs past ``command_timeout``: then every process in the sandbox is killed and the
next command starts a new shell (files in ``/app`` kept; cwd, variables and jobs gone). An agent that
kills the sandbox's supervisor ends its own episode (``sandbox_lost``, reward ``timeout_reward``).

State: a live shell cannot be copied, so ``get_state`` is a record (the task, the RNG, the turn, the
commands run so far) and ``set_state`` drops the sandbox and, at the next command, starts a new one and
replays those commands (their output unseen). Deterministic commands replay exactly; ``$RANDOM``, the
clock or a command that timed out (replayed, and timing out again) are the caveat.

The sandbox starts at the first command, not at reset. With no command run the files are untouched, and
every shipped checker fails on untouched files (asserted by the tests), so such an episode scores 0
without a sandbox.
"""

from __future__ import annotations

import copy
import random
import re
from typing import Any, ClassVar

from gem_core.core import Env
from gem_core.errors import INFRA_ERROR, ResetNeeded
from gem_core.params import Param
from gem_core.parsing import all_fenced, all_tagged, echo
from gem_core.tools.sandbox.policy import SandboxUnavailable, require_bwrap
from gem_core.envs.terminal.shell import APP, CommandResult, ShellLimits, ShellSandbox, cpu_seconds_for
from gem_core.envs.terminal.tasks import BY_NAME, TASK_NAMES, TASKS, Episode, TerminalTask

MAX_COMMAND_CHARS = 16_384
# ```bash / ```sh / ```shell / ```console (or bare ```) fences, or <bash>...</bash>; the last one is the command.
# Found in linear time (gem_core.parsing): a (.*?) regex froze a server for seconds on hostile text.
_FENCE_LANGS = frozenset({"", "bash", "sh", "shell", "console"})
_TAG = ("<bash>", "</bash>")
_SUBMIT = frozenset({"submit", "done", "<submit/>", "<submit>", "exit 0 # submit"})
RANDOM_COMMANDS = ("ls", "ls -la", "pwd", "cat *.txt | head -n 5", "wc -l *", "find . -maxdepth 2 | sort", "echo hello", "true", "false")
RANDOM_SUBMIT = 0.25  # how often the random policy submits: its episodes end in a few turns
# Control characters other than newline and tab (C0, DEL, C1): a terminal would act on them (a title, the
# clipboard through OSC 52, a cleared screen). Observations show them escaped, as \x1b.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")

ACTION_HELP = "Reply with exactly one shell command in a ```bash code block (for example ```bash\nls -la\n```), or with submit when the task is done."


def printable(text: str) -> str:
    """``text`` with every control character but newline and tab escaped (``\\x1b``)."""
    return _CONTROL.sub(lambda match: f"\\x{ord(match.group()):02x}", text)


def parse_action(action: Any) -> tuple[str, str | None]:
    """``("submit", None)``, ``("command", text)`` or ``("error", why)`` for a model reply."""
    if not isinstance(action, str):
        return "error", f"was not text ({type(action).__name__})"
    if action.strip().lower() in _SUBMIT:
        return "submit", None
    blocks = [block.body for block in all_fenced(action, _FENCE_LANGS) or all_tagged(action, *_TAG)]
    if not blocks:
        return "error", "had no ```bash code block"
    command = blocks[-1].strip()
    if not command:
        return "error", "had an empty ```bash code block"
    if command.lower() in _SUBMIT:
        return "submit", None
    if len(command) > MAX_COMMAND_CHARS:
        return "too_long", command
    return "command", command


class TerminalEnv(Env):
    """A shell task per episode (see the module docstring)."""

    params: ClassVar[dict[str, Param]] = {
        "task": Param(str, choices=TASK_NAMES, none="drawn from the shipped tasks by the reset seed"),
        "max_turns": Param(int, low=1, high=200, none="the task's own limit"),
        "command_timeout": Param(float, low=0.5, high=600.0),
        "check_timeout": Param(float, low=0.5, high=600.0),
        "memory_mb": Param(int, low=64, high=65536),
        "cpu_seconds": Param(int, low=1, high=36000, none="the command time limit rounded up, plus one"),
        "max_processes": Param(int, low=4, high=1024),
        "max_output_bytes": Param(int, low=256, high=6000),
        "disk_mb": Param(int, low=1, high=4096),
    }
    answer_format: ClassVar[str] = "bash"  # a command in a ```bash block, not \boxed{} (the generic tests read this)
    success_reward: ClassVar[float] = 1.0
    format_error_reward: ClassVar[float] = -0.1
    timeout_reward: ClassVar[float] = -0.1

    def __init__(
        self,
        task: str | None = None,
        max_turns: int | None = None,
        command_timeout: float = 10.0,
        check_timeout: float = 10.0,
        memory_mb: int = 1024,
        cpu_seconds: int | None = None,
        max_processes: int = 32,
        max_output_bytes: int = 4096,
        disk_mb: int = 64,
    ):
        require_bwrap()  # one clear error, the Python tool's, where bubblewrap is missing
        self.task_arg, self.max_turns_arg = task, max_turns
        self.command_timeout, self.check_timeout = float(command_timeout), float(check_timeout)
        self.limits = ShellLimits(
            memory_mb=int(memory_mb),
            max_processes=int(max_processes),
            cpu_seconds=cpu_seconds_for(command_timeout) if cpu_seconds is None else int(cpu_seconds),
            app_mb=int(disk_mb),
            tmp_mb=int(disk_mb),
        )
        self.max_output_bytes = int(max_output_bytes)
        self.task: TerminalTask = BY_NAME[task] if task is not None else TASKS[0]
        self.episode: Episode | None = None  # this episode's files, instruction, checks and solution (drawn at reset)
        self.max_turns = max_turns or self.task.max_turns
        self.turn = 0
        self.commands: list[str] = []  # every command that reached the shell, in order (the replay record)
        self._done = True
        self._was_reset = False
        self._sandbox: ShellSandbox | None = None
        self._replayed = 0  # how many of self.commands the live sandbox has run

    # -- episode
    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self._close_sandbox()
        if self.task_arg is None:
            self.task = TASKS[int(self.np_random.integers(len(TASKS)))]
        # The episode's data from the seed: a script or an answer made for one episode fails another.
        self.episode = self.task.build(random.Random(int(self.np_random.integers(2**63))))
        self.max_turns = self.max_turns_arg or self.task.max_turns
        self.turn, self.commands, self._done, self._was_reset = 0, [], False, True
        observation = (
            f"You are in a bash shell in {APP}, inside a sandbox with no network.\n\nTask: {self.episode.instruction}\n\n"
            f"{ACTION_HELP} Each command may run for {self.command_timeout:g} seconds; you have {self.max_turns} turns."
        )
        return observation, {"task": self.task.name, "turn": 0, "max_turns": self.max_turns, "format_error": False, "success": False}

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._done:
            raise ResetNeeded(f"{type(self).__name__}.step() called {'before reset()' if not self._was_reset else 'on a finished episode'}; call reset() first")
        self.turn += 1
        kind, value = parse_action(action)
        info: dict[str, Any] = {
            "task": self.task.name,
            "turn": self.turn,
            "format_error": kind == "error",
            "invalid_action": kind == "too_long",
            "success": False,
        }
        reward, terminated = 0.0, False
        if kind == "submit":
            observation, success, extra = self._finish()
            info.update(extra, success=success)
            return observation, self.success_reward if success else 0.0, True, False, info
        if kind == "error":
            observation, reward = f"Your reply {value}. {ACTION_HELP}", self.format_error_reward
        elif kind == "too_long":
            observation, reward = f"Your command {echo(value)} is too long (at most {MAX_COMMAND_CHARS} characters); it was not run.", self.format_error_reward
        else:
            result = self._run(value)
            observation, reward, terminated = self._describe(result, info)
        if terminated or self.turn < self.max_turns:
            self._done = terminated
            if terminated:
                self._close_sandbox()
            return observation, reward, terminated, False, info
        end, success, extra = self._finish()
        info.update(extra, success=success)
        reward += self.success_reward if success else 0.0
        return f"{observation}\n\nYou have used all {self.max_turns} turns. {end}", reward, False, True, info

    def _run(self, command: str) -> CommandResult:
        try:
            sandbox = self._live_sandbox()
        except SandboxUnavailable as exc:
            return CommandResult(lost="the sandbox did not start", infra_error=str(exc)[:300])
        if sandbox is None:
            return CommandResult(lost="the sandbox was lost while its state was being restored")
        self.commands.append(command)
        result = sandbox.run(command, self.command_timeout)
        self._replayed = len(self.commands)
        if result.lost is not None:
            self._close_sandbox()
        return result

    def _describe(self, result: CommandResult, info: dict[str, Any]) -> tuple[str, float, bool]:
        """The observation, reward and whether the episode ends, for one command's result."""
        if result.lost is not None:
            if result.infra_error is not None:
                info[INFRA_ERROR] = result.infra_error
                return f"The sandbox failed ({result.lost}); the episode ends.", 0.0, True
            info["sandbox_lost"] = result.lost
            return f"The sandbox is gone ({result.lost}); the episode ends.", self.timeout_reward, True
        info.update(exit_code=result.exit_code, timed_out=result.timed_out, truncated=result.truncated, limit=result.limit)
        output = printable(result.output)
        body = output if output.endswith("\n") or not output else output + "\n"
        if result.limit == "files":
            self._close_sandbox()
            note = f"[the sandbox holds more than {self.limits.max_inodes} files in one place; the episode ends]"
            info["sandbox_lost"] = "too many files"
            return body + note, self.timeout_reward, True
        if result.limit == "cpu":
            note = (
                f"[the command's processes used more than {self.limits.cpu_seconds} CPU-seconds together and were killed, "
                f"with every process it started; the next command starts a new shell in {APP} (files are kept)]"
            )
            return body + note, self.timeout_reward, False
        if result.limit == "memory":
            note = (
                f"[the command's processes used more than {self.limits.memory_mb} MB of memory together and were killed, "
                f"with every process it started; the next command starts a new shell in {APP} (files are kept)]"
            )
            return body + note, self.timeout_reward, False
        if result.timed_out:
            note = (
                f"[the command ran past {self.command_timeout:g} seconds and was killed, with every process it started; "
                f"the next command starts a new shell in {APP} (files are kept)]"
            )
            return body + note, self.timeout_reward, False
        if result.shell_exited:
            return body + f"[the shell exited; the next command starts a new shell in {APP} (files are kept)]", 0.0, False
        code = "unknown" if result.exit_code is None else result.exit_code  # (a status line the agent forged)
        return body + f"[exit code: {code}]", 0.0, False

    def _finish(self) -> tuple[str, bool, dict[str, Any]]:
        """Run the checker (if anything ran: untouched files fail every shipped checker) and end the episode."""
        self._done = True
        extra: dict[str, Any] = {}
        if not self.commands:
            return "The task is not solved: no command was run.", False, {"checked": False}
        sandbox = None
        try:
            sandbox = self._live_sandbox()
        except SandboxUnavailable as exc:
            extra[INFRA_ERROR] = str(exc)[:300]
        if sandbox is None:
            self._close_sandbox()
            extra.setdefault("sandbox_lost", "the sandbox was gone when the checker was due")
            return "The task could not be checked: the sandbox is gone.", False, {**extra, "checked": False}
        assert self.episode is not None
        result = sandbox.check(list(self.episode.checks), self.check_timeout)
        self._close_sandbox()
        success = result.exit_code == 0 and result.lost is None
        if result.infra_error is not None:
            extra[INFRA_ERROR] = result.infra_error
        extra.update(checked=True, checker_exit_code=result.exit_code, checker_output=echo(printable(result.output)))
        return ("The task is solved: the checker passed." if success else "The task is not solved: the checker failed."), success, extra

    def _live_sandbox(self) -> ShellSandbox | None:
        """The episode's sandbox, started (and the recorded commands replayed) if there is none."""
        if self._sandbox is None:
            assert self.episode is not None
            self._sandbox = ShellSandbox(list(self.episode.files), self.limits, self.max_output_bytes).start()
            self._replayed = 0
        while self._replayed < len(self.commands):
            result = self._sandbox.run(self.commands[self._replayed], self.command_timeout)
            self._replayed += 1
            if result.lost is not None:
                self._close_sandbox()
                return None
        return self._sandbox

    # -- policies
    def sample_random_action(self) -> str:
        if self.np_random.random() < RANDOM_SUBMIT:
            return "submit"
        return f"```bash\n{RANDOM_COMMANDS[int(self.np_random.integers(len(RANDOM_COMMANDS)))]}\n```"

    def oracle_action(self) -> str:
        """The next command of the task's reference solution, then ``submit``."""
        done = len(self.commands)
        solution = self.episode.solution if self.episode is not None else ()
        if done < len(solution):
            return f"```bash\n{solution[done]}\n```"
        return "submit"

    # -- state
    def get_state(self) -> dict[str, Any]:
        return copy.deepcopy({k: v for k, v in self.__dict__.items() if k not in ("_sandbox", "_replayed", "spec")})

    def set_state(self, state: dict[str, Any]) -> None:
        self._close_sandbox()
        self.__dict__.update(copy.deepcopy(state))
        self._sandbox, self._replayed = None, 0  # the next command replays self.commands in a new sandbox

    def close(self) -> None:
        self._close_sandbox()

    def _close_sandbox(self) -> None:
        sandbox = self.__dict__.get("_sandbox")
        if sandbox is not None:
            sandbox.close()
        self._sandbox = None

    def __del__(self) -> None:
        try:
            self._close_sandbox()
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown: the sandbox's own finalizer and the reaper remain
            pass
