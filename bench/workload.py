"""The reference workload, one system per process: prints JSON lines (progress, then result).

    python bench/workload.py SYSTEM --waves 100,200 [--turns 20] [--workers 4]

SYSTEM is ``dormant-memory`` or ``dormant-sqlite`` (``LocalSystem``, this environment) or
``langgraph`` (run with ``bench/.venv-langgraph/bin/python``, ``PYTHONPATH`` set to the
repository so the same text generator is used). ``bench/reference.py`` drives all three.

Each agent does ``--turns`` turns; a turn is user text, a ~1.2 KB streamed completion
calling a deferred tool, the tool's result delivered from outside (``deliver``, or
resuming the LangGraph interrupt), and a second ~1.2 KB completion ending the turn: 40
completions per agent at 20 turns. Agents come in waves; after each wave every agent is
idle, the garbage collector has run, and resident memory is read from /proc/self/statm.
``--heap``, ``--trim`` and ``--tracemalloc`` add the allocators' own counts beside it
(``bench/heap.py``): whether RSS per agent is live bytes or holes a wave left.

The module has no ``from __future__ import annotations``: ``@tool`` and LangGraph read
the annotations of functions defined inside the runners, after lazy imports.
"""

import argparse
import gc
import json
import os
import sqlite3
import sys
import tempfile
import time
import tracemalloc
import zlib
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

from heap import emit_growth, heap_stats, trim

from dormant.models.simulated import simulated_text

COMPLETION_CHARS = 1200
RESULT_CHARS = 200
SEED = 7
BAND = (2.5, 3.5)
"""zlib level 6 over a whole thread's text must compress within this band, as real model
output does; outside it memory figures are meaningless and are not reported."""


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def user_text(agent: int, turn: int) -> str:
    return f"Turn {turn}: check build {agent}-{turn} on main and tell me what broke."


def result_text(thread_id: str, turn: int) -> str:
    return simulated_text(RESULT_CHARS, SEED + 1, f"result:{thread_id}:{turn}")


def model_cpu_us(completions: int = 2000) -> float:
    """CPU microseconds of the simulated provider alone per completion.

    The provider's work in every system: a completion's text, streamed in 48-character
    chunks to a sink that does nothing. A system's CPU per completion less this is its own
    overhead (the runtime, the driver, the tool and the delivery of its result).
    """
    chunks: list[str] = []
    started = time.process_time()
    for n in range(completions):
        text = simulated_text(COMPLETION_CHARS, SEED, f"calibration:{n}")
        for start in range(0, len(text), 48):
            chunks.append(text[start : start + 48])
        chunks.clear()
    return (time.process_time() - started) / completions * 1e6


def compression(texts: list[str]) -> float:
    raw = "\n".join(texts).encode()
    return len(raw) / len(zlib.compress(raw, 6))


class Runner:
    """One system under the workload: ``wave`` runs new agents to idle, turn by turn."""

    completions = 0

    def wave(self, first: int, count: int, turns: int, tick: Callable[[], None]) -> None:
        raise NotImplementedError

    def thread_texts(self, agent: int) -> list[str]:
        raise NotImplementedError

    def stored_bytes(self, agents: int) -> int | None:
        return None

    def close(self) -> None:
        pass


class DormantRunner(Runner):
    def __init__(self, database_url: str, workers: int) -> None:
        from dormant import Agent, LocalSystem, ToolContext, tool
        from dormant.models import SimulatedModel
        from dormant.models.base import ChunkSink, Completion, ModelRequest

        self.pending: list[tuple[str, str]] = []
        runner = self

        @tool(deferred=True)
        def run_build(target: str, ctx: ToolContext) -> None:
            """Start a CI build; the result arrives later."""
            runner.pending.append((ctx.thread_id, ctx.call_id))

        class Counting:
            name = "simulated"
            context_window = 200_000

            def __init__(self) -> None:
                self.inner = SimulatedModel(
                    completion_chars=COMPLETION_CHARS,
                    call_every=1,
                    tool="run_build",
                    tool_args={"target": "main"},
                    seed=SEED,
                )

            def complete(self, request: ModelRequest, on_chunk: ChunkSink) -> Completion:
                runner.completions += 1
                return self.inner.complete(request, on_chunk)

        self.database_url = database_url
        agent = Agent("bench", model=Counting(), tools=[run_build])
        self.system = LocalSystem([agent], database_url=database_url, workers=workers)
        self.ids: dict[int, str] = {}

    def wave(self, first: int, count: int, turns: int, tick: Callable[[], None]) -> None:
        system = self.system
        agents = range(first, first + count)
        for turn in range(turns):
            for a in agents:
                if turn == 0:
                    self.ids[a] = system.launch("bench", user_text(a, 0), thread_id=f"t{a}")
                else:
                    system.send(self.ids[a], user_text(a, turn))
            system.run_until_idle(timeout_s=3600)
            # A tool run is at-least-once (docs/guarantees.md): a run the sweeper re-sent
            # while the first waited in a starved pool records its call twice.
            calls, self.pending = list(dict.fromkeys(self.pending)), []
            if len(calls) != count:
                raise RuntimeError(f"turn {turn}: {len(calls)} tool calls for {count} agents")
            for thread_id, call_id in calls:
                system.deliver(thread_id, call_id, result_text(thread_id, turn))
            system.run_until_idle(timeout_s=3600)
            tick()

    def thread_texts(self, agent: int) -> list[str]:
        texts = []
        for item in self.system.history(self.ids[agent]):
            text = getattr(item, "text", None) or getattr(item, "content", None)
            if isinstance(text, str):
                texts.append(text)
        return texts

    def stored_bytes(self, agents: int) -> int | None:
        from dormant.stores.memory.store import MemoryStore

        store = self.system.store
        if isinstance(store, MemoryStore):
            return sum(store.stored_bytes(t) for t in self.ids.values())
        # The write-ahead log holds pages not yet copied into the file (up to ~4 MB before
        # SQLite checkpoints on its own): copy them, so that the file alone is the data.
        path = Path(self.database_url.removeprefix("sqlite:///"))
        with closing(sqlite3.connect(path)) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))

    def close(self) -> None:
        self.system.close()


class LangGraphRunner(Runner):
    """A tool-calling graph on ``InMemorySaver``; the tool interrupts, results resume it."""

    def __init__(self) -> None:
        from langchain_core.language_models.chat_models import BaseChatModel
        from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
        from langchain_core.outputs import ChatGeneration, ChatResult
        from langchain_core.runnables import RunnableConfig
        from langgraph.checkpoint.memory import InMemorySaver
        from langgraph.graph import END, START, MessagesState, StateGraph
        from langgraph.types import Command, interrupt

        runner = self

        class FakeChat(BaseChatModel):
            """The same text as SimulatedModel, streamed in 48-character chunks."""

            @property
            def _llm_type(self) -> str:
                return "simulated"

            def _generate(
                self,
                messages: list[BaseMessage],
                stop: list[str] | None = None,
                run_manager: Any = None,
                **kwargs: Any,
            ) -> ChatResult:
                runner.completions += 1
                key = f"{kwargs['thread_id']}:{len(messages)}"
                text = simulated_text(COMPLETION_CHARS, SEED, key)
                for start in range(0, len(text), 48):
                    if run_manager is not None:
                        run_manager.on_llm_new_token(text[start : start + 48])
                calls = []
                if isinstance(messages[-1], HumanMessage):
                    call_id = f"call_{runner.completions}"
                    calls = [{"name": "run_build", "args": {"target": "main"}, "id": call_id}]
                message = AIMessage(content=text, tool_calls=calls)
                return ChatResult(generations=[ChatGeneration(message=message)])

        model = FakeChat()

        def agent(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
            thread_id = config["configurable"]["thread_id"]
            return {"messages": [model.invoke(state["messages"], thread_id=thread_id)]}

        def tools(state: MessagesState) -> dict[str, Any]:
            results = []
            for call in state["messages"][-1].tool_calls:  # type: ignore[attr-defined]
                result = interrupt({"call_id": call["id"]})
                results.append(ToolMessage(content=result, tool_call_id=call["id"]))
            return {"messages": results}

        def route(state: MessagesState) -> str:
            return "tools" if state["messages"][-1].tool_calls else END  # type: ignore[attr-defined]

        graph = StateGraph(MessagesState)
        graph.add_node("agent", agent)
        graph.add_node("tools", tools)
        graph.add_edge(START, "agent")
        graph.add_conditional_edges("agent", route, ["tools", END])
        graph.add_edge("tools", "agent")
        self.saver = InMemorySaver()
        self.graph = graph.compile(checkpointer=self.saver)
        self.human = HumanMessage
        self.command = Command

    def wave(self, first: int, count: int, turns: int, tick: Callable[[], None]) -> None:
        agents = range(first, first + count)
        for turn in range(turns):
            for a in agents:
                config = {"configurable": {"thread_id": f"t{a}"}}
                self.graph.invoke({"messages": [self.human(user_text(a, turn))]}, config)
            for a in agents:
                config = {"configurable": {"thread_id": f"t{a}"}}
                self.graph.invoke(self.command(resume=result_text(f"t{a}", turn)), config)
            tick()

    def thread_texts(self, agent: int) -> list[str]:
        state = self.graph.get_state({"configurable": {"thread_id": f"t{agent}"}})
        return [m.content for m in state.values["messages"] if isinstance(m.content, str)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("system", choices=["dormant-memory", "dormant-sqlite", "langgraph"])
    parser.add_argument("--waves", default="100,200")
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument(
        "--tracemalloc",
        type=int,
        default=0,
        metavar="FRAMES",
        help="also count live Python bytes (tracemalloc, FRAMES frames a traceback) after "
        "each wave, and print where they grew between the first wave and the last",
    )
    parser.add_argument(
        "--heap",
        action="store_true",
        help="also read the allocators' used and free bytes after each wave (bench/heap.py)",
    )
    parser.add_argument(
        "--trim",
        action="store_true",
        help="malloc_trim(0) before reading RSS after each wave: RSS less the free pages "
        "inside glibc's heaps (bench/heap.py)",
    )
    args = parser.parse_args()
    waves = [int(w) for w in args.waves.split(",")]
    with tempfile.TemporaryDirectory(prefix="dormant-bench-") as tmp:
        runner: Runner
        if args.system == "langgraph":
            runner = LangGraphRunner()
        elif args.system == "dormant-memory":
            runner = DormantRunner("memory://", args.workers)
        else:
            runner = DormantRunner(f"sqlite:///{tmp}/bench.db", args.workers)
        run(runner, args.system, waves, args.turns, args.tracemalloc, args.heap, args.trim)
        runner.close()


def run(
    runner: "Runner",
    system: str,
    waves: list[int],
    turns: int,
    trace_frames: int = 0,
    heap: bool = False,
    trim_heap: bool = False,
) -> None:
    total_turns = sum(waves) * turns
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        emit({"progress": done, "total": len(waves) * turns})

    # Warm-up: imports, caches, the first thread; not part of any figure.
    runner.wave(-1, 1, 1, lambda: None)
    gc.collect()
    points = [{"agents": 0, "rss_bytes": rss_bytes()}]
    records = []
    agents = 0
    traces: list[tuple[int, tracemalloc.Snapshot]] = []
    if trace_frames:
        tracemalloc.start(trace_frames)
    for count in waves:
        completions_before = runner.completions
        wall, cpu = time.perf_counter(), time.process_time()
        runner.wave(agents, count, turns, tick)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        completions = runner.completions - completions_before
        if completions != count * turns * 2:
            raise RuntimeError(f"{completions} completions, expected {count * turns * 2}")
        agents += count
        gc.collect()
        if trim_heap:
            trim()
        points.append({"agents": agents, "rss_bytes": rss_bytes()})
        if heap:
            points[-1].update(heap_stats())
        if trace_frames:
            points[-1]["traced_bytes"] = tracemalloc.get_traced_memory()[0]
            traces = [*traces[:1], (agents, tracemalloc.take_snapshot())]
        records.append(
            {
                "agents": count,
                "completions": completions,
                "wall_s": wall,
                "cpu_s": cpu,
                "per_wall_s": completions / wall,
                "per_cpu_s": completions / cpu,
            }
        )
    extra = trace_frames > 0 or heap
    if len(traces) == 2:
        emit_growth(traces[0], traces[1])
    ratio = compression(runner.thread_texts(0))
    stored = runner.stored_bytes(agents)
    completions = sum(r["completions"] for r in records)
    cpu_us = sum(r["cpu_s"] for r in records) / completions * 1e6
    model_us = model_cpu_us()
    emit(
        {
            "result": {
                "system": system,
                "turns": turns,
                "completions_per_agent": turns * 2,
                "total_agent_turns": total_turns,
                "waves": records,
                "rss": points,
                "rss_per_idle_agent_bytes": slope(points),
                "stored_bytes_per_agent": None if stored is None else stored / agents,
                "compression_ratio": ratio,
                "compression_in_band": BAND[0] <= ratio <= BAND[1],
                "cpu_us_per_completion": cpu_us,
                "model_cpu_us_per_completion": model_us,
                "overhead_us_per_completion": cpu_us - model_us,
                "python": sys.version.split()[0],
                **({"heap_per_idle_agent_bytes": heap_slopes(points)} if extra else {}),
            }
        }
    )


def heap_slopes(points: list[dict[str, int]]) -> dict[str, float]:
    """``slope`` of each of ``--heap``'s and ``--tracemalloc``'s counts (two waves or more:
    the point before the first has none)."""
    if len(points) < 3:
        return {}
    return {key: slope(points, key) for key in points[-1] if key not in ("agents", "rss_bytes")}


def slope(points: list[dict[str, int]], key: str = "rss_bytes") -> float:
    """Least-squares bytes per agent over the (agents, RSS) points after each wave.

    The point before the first wave is left out when there are two or more waves after
    it: the first wave also fills fixed-size structures (LocalSystem's ring of the last
    10,000 events, allocator arenas) that stop growing, which is no cost per idle agent.
    """
    points = points[1:] if len(points) >= 3 else points
    xs = [p["agents"] for p in points]
    ys = [p[key] for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den


if __name__ == "__main__":
    main()
