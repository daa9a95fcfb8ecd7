"""python -m moe_swift.transformers generate --model PATH_OR_HUB_ID --prompt TEXT: text from a
transformers model whose MoE experts run on moe_swift, streamed as it is generated.

The prompt goes through the tokenizer's chat template when it has one (--no-chat-template
sends it as it is); decoding is greedy unless --temperature is above 0. Needs torch and
transformers 5.
"""

from __future__ import annotations

import argparse
import sys


def _parser():
    parser = argparse.ArgumentParser(prog="python -m moe_swift.transformers",
                                     description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    generate = commands.add_parser("generate", help="generate text from a prompt")
    generate.add_argument("--model", required=True, help="a local folder or a Hugging Face Hub id")
    generate.add_argument("--prompt", required=True)
    generate.add_argument("--max-new-tokens", type=int, default=100)
    generate.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    generate.add_argument("--dtype", default="auto", help='"auto" (the checkpoint\'s), float32, bfloat16, float16')
    generate.add_argument("--backend", default="auto", help="moe_swift's backend: auto, cpu, metal, softmetal")
    generate.add_argument("--experts-implementation", default="moe_swift",
                          help='"moe_swift", or transformers\' own ("eager", "grouped_mm") to compare')
    generate.add_argument("--no-chat-template", action="store_true")
    generate.add_argument("--seed", type=int, default=0)
    return parser


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, TextStreamer
    except ImportError as exc:
        print(f"python -m moe_swift.transformers needs torch and transformers 5: {exc}", file=sys.stderr)
        return 2
    from .integrations import transformers as integration

    implementation = args.experts_implementation
    if implementation == "moe_swift":
        implementation = integration.register(backend=args.backend)
    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=args.dtype,
                                                 experts_implementation=implementation)
    if args.no_chat_template or tokenizer.chat_template is None:
        inputs = tokenizer(args.prompt, return_tensors="pt")
    else:
        inputs = tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}], add_generation_prompt=True,
                                               return_tensors="pt", return_dict=True)
    sampling = dict(do_sample=True, temperature=args.temperature) if args.temperature > 0 else dict(do_sample=False)
    with torch.inference_mode():
        model.generate(**inputs, max_new_tokens=args.max_new_tokens,
                       streamer=TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True),
                       pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id, **sampling)
    return 0


if __name__ == "__main__":
    sys.exit(main())
