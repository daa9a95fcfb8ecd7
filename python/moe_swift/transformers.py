"""python -m moe_swift.transformers generate|chat --model PATH_OR_HUB_ID: text from a
transformers model whose MoE experts run on moe_swift, streamed as it is generated.

`generate --prompt TEXT` answers one prompt; `chat` reads one message per line from stdin
and answers each, keeping the conversation. The prompt goes through the tokenizer's chat
template when it has one (generate's --no-chat-template sends it as it is); decoding is
greedy unless --temperature is above 0. After each answer, stderr gets the time to the
first token and the tokens/s after it. Needs torch and transformers 5. Usage errors exit
with 2, failures with 1, each with one line on stderr; a Hub id with the network down is
used from the cache, or fails in seconds.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

from ._commands import UsageError, looks_like_hub_id, prepare_hub_model, run

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
    chat = commands.add_parser("chat", help="a conversation: one message per line of stdin")
    for command in (generate, chat):
        command.add_argument("--model", required=True, help="a local folder or a Hugging Face Hub id (org/name)")
        if command is generate:
            command.add_argument("--prompt", required=True)
        command.add_argument("--max-new-tokens", type=_positive_int, default=100 if command is generate else 256)
        command.add_argument("--temperature", type=_temperature, default=0.0, help="0: greedy")
        command.add_argument("--dtype", default="auto", choices=DTYPES, help='"auto": the checkpoint\'s')
        command.add_argument("--backend", default="auto", choices=sorted(BACKENDS), help="moe_swift's backend")
        command.add_argument("--experts-implementation", default="moe_swift", choices=IMPLEMENTATIONS,
                             help='"moe_swift", or transformers\' own ("eager", "grouped_mm") to compare')
        if command is generate:
            command.add_argument("--no-chat-template", action="store_true")
        command.add_argument("--seed", type=int, default=0)
    return parser


def _check_model(model):
    """A local folder (anything but a Hub id) must exist and hold a config and a tokenizer."""
    path = os.path.expanduser(model)
    if not os.path.isdir(path):
        raise UsageError(f"--model {model}: no such folder (a Hugging Face Hub id is org/name)")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise UsageError(f"--model {model}: the folder has no config.json (a transformers model's folder has)")
    if not any(os.path.isfile(os.path.join(path, name)) for name in TOKENIZER_FILES):
        raise UsageError(f"--model {model}: the folder has no tokenizer ({', '.join(TOKENIZER_FILES)}); "
                         "save the model's tokenizer there (tokenizer.save_pretrained(folder))")


def _load(args):
    """(torch, transformers, tokenizer, model) for the command's arguments."""
    if looks_like_hub_id(args.model):
        prepare_hub_model(PROG, args.model)  # before transformers imports huggingface_hub
    else:
        _check_model(args.model)
        args.model = os.path.expanduser(args.model)  # transformers would take "~" as a folder's name
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise UsageError(f"needs torch and transformers 5 (pip install torch transformers; on Linux the CPU-only "
                         f"torch: --index-url https://download.pytorch.org/whl/cpu): {exc}") from None
    from .integrations import transformers as integration

    implementation = args.experts_implementation
    if implementation == "moe_swift":
        implementation = integration.register(backend=args.backend)
    torch.manual_seed(args.seed)
    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=args.dtype,
                                                              experts_implementation=implementation)
    return torch, transformers, tokenizer, model


def _answer(torch, transformers, tokenizer, model, inputs, args):
    """Generates from `inputs`, streaming the text to stdout; the new token ids. Says on
    stderr how long the first token took and the rate after it."""
    times = []

    class TimedStreamer(transformers.TextStreamer):
        def put(self, value):
            times.append(time.perf_counter())  # the first call is the prompt's (skipped)
            super().put(value)

    sampling = dict(do_sample=True, temperature=args.temperature) if args.temperature > 0 else dict(do_sample=False)
    prompt_tokens = inputs["input_ids"].shape[-1]
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=args.max_new_tokens,
                             streamer=TimedStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True),
                             pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id, **sampling)
    end = time.perf_counter()
    new = out.shape[-1] - prompt_tokens
    tokens = times[1:]  # one put per new token after the prompt's
    first = (tokens[0] if tokens else end) - start
    rate = f", then {(len(tokens) - 1) / (end - tokens[0]):.1f} tokens/s" if len(tokens) > 1 and end > tokens[0] else ""
    # On stderr, so that stdout is the text alone.
    print(f"{PROG}: {new} tokens in {end - start:.2f} s: the first after {first:.2f} s (a prompt of "
          f"{prompt_tokens} tokens){rate}; experts: {args.experts_implementation}", file=sys.stderr)
    return out[0, prompt_tokens:]


def _generate(args):
    if not args.prompt.strip():
        raise UsageError("--prompt is empty: give the text to continue")
    torch, transformers, tokenizer, model = _load(args)
    if args.no_chat_template or tokenizer.chat_template is None:
        inputs = tokenizer(args.prompt, return_tensors="pt")
    else:
        inputs = tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}], add_generation_prompt=True,
                                               return_tensors="pt", return_dict=True)
    if inputs["input_ids"].shape[-1] == 0:
        raise UsageError("--prompt gives no tokens with this tokenizer: give other text")
    _answer(torch, transformers, tokenizer, model, inputs, args)


def _chat(args):
    torch, transformers, tokenizer, model = _load(args)
    if tokenizer.chat_template is None:
        raise UsageError(f"--model {args.model}: its tokenizer has no chat template, so it is not a chat model; "
                         "use generate --no-chat-template")
    interactive = sys.stdin.isatty()
    if interactive:
        print(f"{PROG}: one message per line; an empty line or Ctrl-D ends", file=sys.stderr)
    messages = []
    while True:
        try:
            line = input("> " if interactive else "")
        except EOFError:
            break
        if not line.strip():
            if interactive:
                break
            continue
        messages.append({"role": "user", "content": line})
        inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                               return_dict=True)
        reply = _answer(torch, transformers, tokenizer, model, inputs, args)
        sys.stdout.flush()  # the streamer ended the answer's line
        messages.append({"role": "assistant", "content": tokenizer.decode(reply, skip_special_tokens=True)})


def main(argv=None) -> int:
    args = _parser().parse_args(argv)  # argparse's usage errors: exit 2
    return run(PROG, lambda: (_generate if args.command == "generate" else _chat)(args))


if __name__ == "__main__":
    sys.exit(main())
