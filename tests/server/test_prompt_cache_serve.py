"""The prompt cache across a restart of `serve`, and two servers sharing one cache folder
under load: real servers on loopback, the real OpenAI client, the default (native) engine,
whose greedy answers do not depend on how requests are batched."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .test_serve import Server

SYSTEM = " ".join(f"Rule {i}: answer briefly, and name the lighthouse of cape {i % 5} when asked." for i in range(45))
QUESTIONS = ["Which cape has a lighthouse?", "What is rule 3?", "Say hello."]


def ask(server: Server, question: str):  # type: ignore[no-untyped-def]
    return server.client().chat.completions.create(model=server.model, temperature=0, max_tokens=12,
                                                    messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])  # fmt: skip


def test_a_restarted_server_answers_from_disk(model_path: Path, tmp_path: Path) -> None:
    first = Server(str(model_path), "--cache-dir", str(tmp_path), "--parallel", "1", "--draft", "none")
    try:
        cold = ask(first, QUESTIONS[0])
        assert cold.usage.prompt_tokens_details.cached_tokens == 0
    finally:
        code, log = first.stop()
    assert code == 0 and "Traceback" not in log
    second = Server(str(model_path), "--cache-dir", str(tmp_path), "--parallel", "1", "--draft", "none")
    try:
        warm = ask(second, QUESTIONS[0])
        assert warm.choices[0].message.content == cold.choices[0].message.content
        assert warm.usage.prompt_tokens_details.cached_tokens >= 512  # the system prompt's whole blocks, from disk
        m = second.metrics()
        assert m['localinfer_prompt_cache_hits_total{tier="disk"}'] >= 2 and m['localinfer_prompt_cache_bytes{tier="disk"}'] > 0
    finally:
        code, log = second.stop()
    assert code == 0 and "Traceback" not in log


def test_two_servers_share_one_cache_folder_under_load(model_path: Path, tmp_path: Path) -> None:
    servers = [Server(str(model_path), "--cache-dir", str(tmp_path), "--parallel", "2", "--draft", "none") for _ in range(2)]
    try:
        expected = {q: ask(servers[0], q).choices[0].message.content for q in QUESTIONS}
        jobs = [(servers[i % 2], QUESTIONS[i % len(QUESTIONS)]) for i in range(12)]
        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(lambda job: ask(*job), jobs))
        for (_, question), a in zip(jobs, answers):
            assert a.choices[0].message.content == expected[question]
        assert any(a.usage.prompt_tokens_details.cached_tokens for a in answers)
    finally:
        for s in servers:
            code, log = s.stop()
            assert code == 0 and "Traceback" not in log and "damaged" not in log
