"""A verifiers taskset for `vf-eval` (loaded by its module name, `fetch_taskset`): one task
whose `network_allow` is `allowed.test`, as a task of a real taskset carries its lists."""

from __future__ import annotations

from collections.abc import Iterator

from verifiers.v1.configs.taskset import TasksetConfig
from verifiers.v1.task import Task, TaskData
from verifiers.v1.taskset import Taskset


class FetchTasksetConfig(TasksetConfig):  # type: ignore[misc]
    pass


class FetchTaskset(Taskset[Task, FetchTasksetConfig]):  # type: ignore[misc]
    def load(self) -> Iterator[Task]:
        yield Task(TaskData(prompt="fetch", network_allow=["allowed.test"]))


__all__ = ["FetchTaskset", "FetchTasksetConfig"]
