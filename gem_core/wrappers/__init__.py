"""Wrappers that each change one thing about an env; everything else is delegated live.

``HistoryWrapper`` renders the episode so far as one text observation, ``EpisodeStatistics`` adds a
per-episode summary to the last step's info (``EpisodeTotals`` sums such summaries up), ``TimeLimit`` truncates after a number of turns.
"""

from gem_core.wrappers.episode_statistics import EpisodeStatistics, EpisodeTotals
from gem_core.wrappers.history import HistoryWrapper
from gem_core.wrappers.time_limit import TimeLimit
from gem_core.wrappers.tool_use import ToolEnvWrapper

__all__ = ["EpisodeStatistics", "EpisodeTotals", "HistoryWrapper", "TimeLimit", "ToolEnvWrapper"]
