"""python -m moe_swift.transformers generate --model PATH_OR_HUB_ID --prompt TEXT: text from a
transformers model whose MoE experts run on moe_swift, streamed as it is generated.

The prompt goes through the tokenizer's chat template when it has one (--no-chat-template
sends it as it is); decoding is greedy unless --temperature is above 0. Needs torch and
transformers 5. Usage errors exit with 2, failures with 1, each with one line on stderr.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

from ._commands import UsageError, run

PROG = "python -m moe_swift.transformers"
DTYPES = ("auto", "float32", "bfloat16", "float16")
IMPLEMENTATIONS = ("moe_swift", "eager", "grouped_mm")
# The files one of which a folder's tokenizer needs (AutoTokenizer reads them).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json", "vocab.txt")


def _positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _temperature(text):
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0 (0: greedy), got {text}")
    return value


def _parser():
    from .options import BACKENDS

    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    generate = commands.add_parser("generate", help="generate text from a prompt")
    generate.add_argument("--model", required=True, help="a local folder or a Hugging Face Hub id (org/name)")
    generate.add_argument("--prompt", required=True)
    generate.add_argument("--max-new-tokens", type=_positive_int, default=100)
    generate.add_argument("--temperature", type=_temperature, default=0.0, help="0: greedy")
    generate.add_argument("--dtype", default="auto", choices=DTYPES, help='"auto": the checkpoint\'s')
    generate.add_argument("--backend", default="auto", choices=sorted(BACKENDS), help="moe_swift's backend")
    generate.add_argument("--experts-implementation", default="moe_swift", choices=IMPLEMENTATIONS,
                          help='"moe_swift", or transformers\' own ("eager", "grouped_mm") to compare')
    generate.add_argument("--no-chat-template", action="store_true")
    generate.add_argument("--seed", type=int, default=0)
    return parser


def _check_model(model):
    """A local folder must exist and hold a tokenizer; anything else must look like a Hub id."""
    looks_local = os.path.isabs(model) or model.startswith((".", "~")) or model.count("/") != 1 or os.path.exists(model)
    if not looks_local:
        return
    path = os.path.expanduser(model)
    if not os.path.isdir(path):
        raise UsageError(f"--model {model}: no such folder (a Hugging Face Hub id is org/name)")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise UsageError(f"--model {model}: the folder has no config.json (a transformers model's folder has)")
    if not any(os.path.isfile(os.path.join(path, name)) for name in TOKENIZER_FILES):
        raise UsageError(f"--model {model}: the folder has no tokenizer ({', '.join(TOKENIZER_FILES)}); "
                         "save the model's tokenizer there (tokenizer.save_pretrained(folder))")


def _generate(args):
    if not args.prompt.strip():
        raise UsageError("--prompt is empty: give the text to continue")
    _check_model(args.model)
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, TextStreamer
    except ImportError as exc:
        raise UsageError(f"needs torch and transformers 5 (pip install torch transformers): {exc}") from None
    from .integrations import transformers as integration

    implementation = args.experts_implementation
    if implementation == "moe_swift":
        implementation = integration.register(backend=args.backend)
    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=args.dtype, experts_implementation=implementation)
    if args.no_chat_template or tokenizer.chat_template is None:
        inputs = tokenizer(args.prompt, return_tensors="pt")
    else:
        inputs = tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}], add_generation_prompt=True,
                                               return_tensors="pt", return_dict=True)
    if inputs["input_ids"].shape[-1] == 0:
        raise UsageError("--prompt gives no tokens with this tokenizer: give other text")
    sampling = dict(do_sample=True, temperature=args.temperature) if args.temperature > 0 else dict(do_sample=False)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=args.max_new_tokens,
                             streamer=TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True),
                             pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id, **sampling)
    seconds = time.perf_counter() - start
    new = out.shape[-1] - inputs["input_ids"].shape[-1]
    # The whole model's rate (prompt included), on stderr so that stdout is the text alone.
    print(f"{PROG}: {new} tokens in {seconds:.2f} s ({new / seconds:.1f} tokens/s, prompt of "
          f"{inputs['input_ids'].shape[-1]} tokens included; experts: {args.experts_implementation})", file=sys.stderr)


def main(argv=None) -> int:
    args = _parser().parse_args(argv)  # argparse's usage errors: exit 2
    return run(PROG, lambda: _generate(args))


if __name__ == "__main__":
    sys.exit(main())
