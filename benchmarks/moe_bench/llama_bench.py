"""llama.cpp's own benchmark of a whole model: the natively built `llama-bench` on a GGUF
file, prompt processing (pp N) and token generation (tg N), in tokens/s.

    cd benchmarks && python -m moe_bench.llama_bench FILE.gguf --pp 256 --tg 32 -t 2

`llama_bench()` runs it with `-o json` and returns llama-bench's own mean and standard
deviation over the repetitions. The binary is the one benchmarks/native/build_llama_cpp.sh
builds (beside the ggml-native peer's libraries: $MOE_BENCH_GGML_LIB, else
benchmarks/results/llama.cpp-native/build/bin). Everything else is llama-bench's default,
as its users run it (batch 2048, micro-batch 512, weights repacked, memory-mapped file).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from . import ggml


def binary() -> Path:
    return ggml.native_lib_dir() / "llama-bench"


def build_description(rows: list[dict]) -> str:
    """The build that ran: llama.cpp's commit as llama-bench reports it, where it came from
    (build_llama_cpp.sh's record) and what ggml's CPU backend says it was built with."""
    commit = rows[0].get("build_commit", "?") if rows else "?"
    record = ggml.native_build_info()
    parts = [f"llama.cpp {commit}" + (f" from llama-cpp-python {record.get('llama_cpp_python', '?')}'s sdist (ggml "
                                      f"{record.get('ggml_version', '?')}, {record.get('march', '?')}, "
                                      f"{record.get('compiler', '?')})" if record else "")]
    try:
        features = [k for k, v in ggml.lib("native").features().items() if v == "1"]
        parts.append("ggml CPU features: " + (" ".join(features) or "none reported"))
    except OSError as exc:
        parts.append(f"ggml CPU features: unknown ({exc})")
    return "; ".join(parts)


def llama_bench(gguf: Path, *, prompt: int = 512, generate: int = 128, threads: int, repetitions: int = 5,
                extra_args: tuple[str, ...] = (), timeout: float | None = None) -> dict:
    """llama-bench on `gguf`: pp `prompt` and tg `generate` (either 0: not run) on `threads`
    threads, `repetitions` runs each after llama-bench's warm-up run. Returns tokens/s:

        prefill_tps, prefill_sd   pp: mean and standard deviation over the repetitions
        decode_tps, decode_sd     tg: likewise (None where not run)
        prefill_samples, decode_samples   every repetition's tokens/s
        build                     llama.cpp commit, its origin, ggml's CPU features
        model_type, model_size, model_n_params, cpu_info, command, rows (llama-bench's JSON)

    Raises FileNotFoundError when llama-bench is not built (naming the command that builds
    it) or the file is missing, RuntimeError when llama-bench fails."""
    exe = binary()
    if not exe.exists():
        raise FileNotFoundError(f"llama-bench is not built ({exe} is missing): build llama.cpp natively with "
                                f"`{ggml.NATIVE_BUILD_COMMAND}` (or set {ggml.NATIVE_LIB_ENV} to a build's bin "
                                "directory)")
    gguf = Path(gguf)
    if not gguf.is_file():
        raise FileNotFoundError(f"{gguf}: no such GGUF file (benchmarks/make_gguf_model.py writes one)")
    if prompt < 0 or generate < 0 or prompt + generate == 0:
        raise ValueError(f"prompt and generate must be >= 0, not both 0 (got {prompt}, {generate})")
    if threads < 1 or repetitions < 1:
        raise ValueError(f"threads and repetitions must be positive (got {threads}, {repetitions})")
    cmd = [str(exe), "-m", str(gguf), "-p", str(prompt), "-n", str(generate), "-t", str(threads),
           "-r", str(repetitions), "-o", "json", *extra_args]
    try:
        # Its libraries beside it, wherever the build directory now is (the build's RUNPATH
        # names the directory it was built in).
        env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(filter(None, [str(exe.parent),
                                                                            os.environ.get("LD_LIBRARY_PATH")])))
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"llama-bench took longer than {timeout} s: {' '.join(cmd)}") from None
    if run.returncode != 0:
        tail = "\n".join(run.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"llama-bench failed (exit {run.returncode}): {' '.join(cmd)}\n{tail}")
    try:
        rows = json.loads(run.stdout)
    except json.JSONDecodeError as exc:
        raise RuntimeError(f"llama-bench printed no JSON ({exc}): {run.stdout[:500]!r}") from None
    pp = [r for r in rows if r["n_prompt"] > 0 and r["n_gen"] == 0]
    tg = [r for r in rows if r["n_gen"] > 0 and r["n_prompt"] == 0]
    if (prompt and len(pp) != 1) or (generate and len(tg) != 1):
        raise RuntimeError(f"llama-bench reported {len(pp)} pp and {len(tg)} tg tests, expected "
                           f"{int(bool(prompt))} and {int(bool(generate))}")

    def stat(found, key):
        return float(found[0][key]) if found else None

    first = rows[0]
    return dict(prefill_tps=stat(pp, "avg_ts"), prefill_sd=stat(pp, "stddev_ts"),
                decode_tps=stat(tg, "avg_ts"), decode_sd=stat(tg, "stddev_ts"),
                prefill_samples=[float(v) for v in pp[0]["samples_ts"]] if pp else [],
                decode_samples=[float(v) for v in tg[0]["samples_ts"]] if tg else [],
                prompt=prompt, generate=generate, threads=threads, repetitions=repetitions,
                build=build_description(rows), model_type=first.get("model_type"),
                model_size=first.get("model_size"), model_n_params=first.get("model_n_params"),
                cpu_info=first.get("cpu_info"), command=cmd, rows=rows)


def table(res: dict) -> str:
    lines = [f"llama-bench, {res['threads']} threads, {res['repetitions']} repetitions: {res['model_type']} "
             f"({res['model_size'] / 1e9:.2f} GB, {res['model_n_params'] / 1e9:.2f} B parameters)",
             f"  build: {res['build']}", f"  CPU: {res['cpu_info']}", "",
             f"{'test':8s}  {'tokens/s':>10s}  {'sd':>8s}"]
    for name, n, key in (("pp", res["prompt"], "prefill"), ("tg", res["generate"], "decode")):
        if res[f"{key}_tps"] is not None:
            lines.append(f"{name + str(n):8s}  {res[f'{key}_tps']:10.2f}  {res[f'{key}_sd']:8.2f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m moe_bench.llama_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("gguf", type=Path, help="the model file (benchmarks/make_gguf_model.py writes one)")
    p.add_argument("--pp", type=int, default=512, help="prompt tokens processed in one batch (0: no pp test)")
    p.add_argument("--tg", type=int, default=128, help="tokens generated one by one (0: no tg test)")
    p.add_argument("-t", "--threads", type=int, required=True, help="threads (llama-bench -t)")
    p.add_argument("-r", "--repetitions", type=int, default=5, help="runs of each test (default 5)")
    p.add_argument("--json", type=Path, help="also write the result (with llama-bench's rows) here")
    a = p.parse_args(argv)
    try:
        res = llama_bench(a.gguf, prompt=a.pp, generate=a.tg, threads=a.threads, repetitions=a.repetitions)
    except (FileNotFoundError, RuntimeError, ValueError) as exc:
        print(f"llama_bench: {exc}", file=sys.stderr)
        return 1
    print(table(res))
    if a.json:
        a.json.write_text(json.dumps(res, indent=1) + "\n")
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
