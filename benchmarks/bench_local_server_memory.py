"""A local server's resident memory across distinct prompts: the user-error judge's pattern.

Each prompt is new from its first token (a judge reads a different conversation each time), so
nothing is reused; a server that keeps per-prompt state grows with every call. Prints the server's
RSS after start and after each prompt (`max_tokens=1`: prompt processing only).

usage: python benchmarks/bench_local_server_memory.py [--model smollm2] [--prompts 3] [--words 150]
"""

from __future__ import annotations

import argparse
import sys
import time

import httpx
import psutil

from envforge.harness import LOCAL_MODELS, assemble, start_local_server, stop_local_server


def main(args: argparse.Namespace) -> int:
    model = LOCAL_MODELS[args.model]
    server = start_local_server(model, assemble(model))
    try:
        proc = psutil.Process(server.process.pid)
        print(f"{model.name}: after start: {proc.memory_info().rss >> 20} MB", flush=True)
        for i in range(args.prompts):
            text = f"Conversation {i}: " + " ".join(f"word{i}x{j}" for j in range(args.words))
            started = time.perf_counter()
            response = httpx.post(
                server.base_url + "/chat/completions",
                json={"model": model.name, "messages": [{"role": "user", "content": text}], "max_tokens": 1},
                headers={"Authorization": f"Bearer {server.api_key}"},
                timeout=900,
            )
            response.raise_for_status()
            tokens = response.json()["usage"]["prompt_tokens"]
            print(
                f"prompt {i}: {tokens} tokens in {time.perf_counter() - started:.1f} s; "
                f"RSS {proc.memory_info().rss >> 20} MB",
                flush=True,
            )
    finally:
        stop_local_server(server)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", choices=sorted(LOCAL_MODELS))
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--words", type=int, default=150)
    sys.exit(main(parser.parse_args()))
