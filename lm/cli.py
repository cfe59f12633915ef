"""The command line: ``lm train | sample | eval | compare | bench | attention | positions | view
| heads | export | import`` (also ``python -m lm``).

Thin by design: each subcommand parses its flags and calls one importable function. Any error
the user caused (config, file, flag, prompt, checkpoint) is one line on standard error and exit
status 2; results go to standard output, progress and notes to standard error.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path
from typing import Any, NoReturn

from lm import __version__
from lm.benchmark.flags import add_bench_parser, add_overrides, bench_command
from lm.config.errors import FLAGS, LMError, one_line
from lm.config.names import SPLITS
from lm.config.outside import trusting, user_files
from lm.config.values import checked_text, finite_at_least_zero, whole_number
from lm.explorer.flags import TRUST_HELP, add_view_parser, view_command
from lm.hf import MODELS
from lm.runtime.launch import every_rank_meets, launched_rank

LINGER_S = 5.0
"""How long a torchrun process that leaves a line to rank 0 waits before it exits with a failure:
torchrun ends every process once one fails, and rank 0 must say the line first."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line (it prints usage plus an error by default)."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {one_line(message)} (see --help)", file=sys.stderr)
        raise SystemExit(2)

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> Any:
        # Some Pythons (3.11) drop a lone "--" given as an option's value (--device=--) and hand
        # the option an empty list, which no command expects: name it instead.
        dashes = action.option_strings and action.nargs is None and arg_strings == ["--"]
        value = super()._get_values(action, arg_strings)
        if dashes and value == []:
            self.error(f"argument {'/'.join(action.option_strings)}: expected a value, not '--'")
        return value


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of integers"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError(f"{text!r}: no values")
    return values


def _lengths(text: str) -> list[str]:
    """Evaluation lengths: tokens (``256``) or multiples of the trained context (``2x``)."""
    from lm.evaluate import parse_context_lengths

    try:
        return parse_context_lengths(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


LENGTHS_HELP = (
    "comma-separated lengths: tokens (e.g. 256) or multiples of the trained context with an x "
    "(e.g. 1x,1.5x,2x,4x,8x)"
)
ROPE_SCALING_HELP = (
    "evaluate a RoPE run with another context extension (same weights, no retraining): none, "
    "pi:S (Position Interpolation), ntk:S (NTK-aware) or yarn:S (YaRN), S the factor"
)


CHECKPOINT_HELP = (
    "use this checkpoint instead of the newest: a folder, or a name in RUN_DIR/checkpoints such "
    "as step_00000030"
)
DEVICE_HELP = "auto (default: cuda, then mps, then cpu) | cpu | cuda | cuda:N | mps"


def positive_int(text: str) -> int:
    try:
        return whole_number(text, 1)
    except LMError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _non_negative_float(text: str) -> float:
    try:
        return finite_at_least_zero(text)
    except LMError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _jobs(text: str) -> int | str:
    """``--jobs``: a count of 1 or more, or ``auto``."""
    if text.strip() == "auto":
        return "auto"
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        message = f"{text!r} is not a count of 1 or more, nor auto"
        raise argparse.ArgumentTypeError(message) from None


def _seeds(text: str) -> list[int]:
    values = _int_list(text)
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"{text!r}: give distinct seeds, e.g. 1,2,3")
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="lm",
        description="Train tiny next-token language models and see what attention and position do.",
    )
    parser.add_argument("--version", action="version", version=f"lm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    t = sub.add_parser("train", help="train a model from a YAML config")
    t.add_argument("config", help="YAML config (see configs/)")
    add_overrides(
        t, "override config keys by dotted name, e.g. --set model.position=alibi train.lr=3e-4"
    )
    t.add_argument("--out", help="run directory (default: runs/<config name>)")
    group = t.add_mutually_exclusive_group()
    group.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    group.add_argument("--overwrite", action="store_true", help="discard the run and start again")
    t.add_argument("--quiet", action="store_true", help="no progress bar or notes")
    t.add_argument(
        "--init-from",
        metavar="RUN_DIR",
        help="start from this run's newest weights (fresh optimizer, step 0, its tokenizer)",
    )

    s = sub.add_parser("sample", help="continue prompts with a trained model")
    s.add_argument("run_dir", help="run directory written by lm train")
    s.add_argument("--checkpoint", metavar="NAME|PATH", help=CHECKPOINT_HELP)
    s.add_argument(
        "--prompt",
        action="append",
        required=True,
        help="text to continue; repeat for a batch; '-' reads standard input",
    )
    s.add_argument(
        "--max-new-tokens", type=positive_int, default=200, help="tokens to add (default 200)"
    )
    s.add_argument(
        "--temperature", type=_non_negative_float, default=0.0, help="0 = greedy (default)"
    )
    s.add_argument(
        "--top-k", type=positive_int, default=None, help="sample from the K likeliest tokens only"
    )
    s.add_argument("--seed", type=int, default=None, help="makes sampling reproducible")
    s.add_argument("--no-kv-cache", action="store_true", help="recompute every step (slower)")
    s.add_argument(
        "--compile",
        action="store_true",
        help="compile the one-token decoding step (torch.compile: seconds to start, then faster)",
    )
    s.add_argument("--rope-scaling", metavar="METHOD:FACTOR", help=ROPE_SCALING_HELP)
    s.add_argument("--device", default="auto", help=DEVICE_HELP)
    s.add_argument("--trust-code", action="store_true", help=TRUST_HELP)

    e = sub.add_parser(
        "eval",
        help="validation loss and perplexity at several context lengths; for a run on a "
        "generated task (builtin:copy, ...), also exact-match accuracy at each task length",
    )
    e.add_argument("run_dir")
    e.add_argument("--split", choices=SPLITS, default="val", help="the split to read (default val)")
    e.add_argument(
        "--context-lengths",
        type=_lengths,
        default=None,
        help=LENGTHS_HELP + " (default: the trained context)",
    )
    e.add_argument("--rope-scaling", metavar="METHOD:FACTOR", help=ROPE_SCALING_HELP)
    e.add_argument("--checkpoint", metavar="NAME|PATH", help=CHECKPOINT_HELP)
    e.add_argument(
        "--batch-size",
        type=positive_int,
        help="windows per batch at the trained length, fewer at longer ones (default: "
        "train.eval_batch_size, else the training micro-batch)",
    )
    e.add_argument("--max-batches", type=positive_int, help="evaluate only this many batches")
    e.add_argument("--device", default="auto", help=DEVICE_HELP)
    e.add_argument("--trust-code", action="store_true", help=TRUST_HELP)

    c = sub.add_parser(
        "compare",
        help="train runs that differ in one key (a sweep) and compare them: table, plots, samples",
    )
    c.add_argument(
        "paths",
        nargs="+",
        metavar="CONFIG_OR_RUN",
        help="one CONFIG.yaml with --vary (a sweep), or run folders / a sweep folder (report only)",
    )
    c.add_argument(
        "--vary",
        action="append",
        metavar="KEY=V1,V2,...",
        help="the key to compare and its values, e.g. model.position=rope,sinusoidal,learned "
        "(a list value keeps its commas inside brackets: 'model.position=rope,[rope,none]'; a "
        "value joins other settings of its runs with +: none+model.normalize=stick_breaking); "
        "give it again with eval.rope_scaling=none,pi:4,ntk:4,yarn:4 to also evaluate every RoPE "
        "run with each context extension (no retraining)",
    )
    c.add_argument(
        "--seeds", type=_seeds, help="train.seed values, e.g. 1,2,3 (default: the config's)"
    )
    add_overrides(c, "override config keys for every run of the sweep")
    c.add_argument("--out", help="folder of the sweep's runs and report (default: runs/compare)")
    c.add_argument(
        "--prompt",
        help="text every run continues (default: 'The for statement', for runs on a generated "
        "task a prompt of the task, or what the folder's sweep.json records)",
    )
    c.add_argument(
        "--max-new-tokens",
        type=positive_int,
        help="length of each continuation (default: 80, or what sweep.json records)",
    )
    c.add_argument(
        "--eval-lengths",
        type=_lengths,
        help=LENGTHS_HELP + " (default: 1x,2x,4x, or what the folder's sweep.json records)",
    )
    c.add_argument("--rope-scaling", metavar="METHOD:FACTOR", help=ROPE_SCALING_HELP)
    c.add_argument(
        "--eval-batches",
        type=positive_int,
        help="batches per context length (default: the whole validation split, or what "
        "sweep.json records)",
    )
    c.add_argument(
        "--device", default="auto", help="device of the report's evaluation: " + DEVICE_HELP
    )
    c.add_argument(
        "--jobs",
        type=_jobs,
        default=1,
        help="runs trained at once, in processes of their own (default 1): on CPU the cores are "
        "divided between them (train.threads), on GPUs they go round-robin over the devices; "
        "auto: one per core where the sweep, predicted from its step timed here on every core "
        "and on one thread, takes at most 0.9 of one at a time, else 1 (one per GPU); runs "
        "left training take the cores finished ones give back",
    )
    c.add_argument(
        "--init-from",
        metavar="DIR",
        help="fine-tune: each seed N's run starts from the weights of DIR/seed<N> (a sweep's "
        "runs of one value, e.g. runs/passkey/position=rope), as lm train --init-from does",
    )
    c.add_argument("--quiet", action="store_true", help="no progress bars or notes")
    c.add_argument("--trust-code", action="store_true", help=TRUST_HELP)

    add_bench_parser(sub, _jobs)  # lm/benchmark/flags.py

    a = sub.add_parser("attention", help="draw a trained model's attention over a text")
    a.add_argument("run_dir")
    a.add_argument("--text", required=True, help="the text whose tokens label the axes")
    a.add_argument("--layer", type=int, help="0-based (default: the last layer)")
    a.add_argument("--head", type=int, help="0-based (default: a grid of every head)")
    a.add_argument("--out", help="PNG file (default: RUN_DIR/attention.png)")
    a.add_argument("--device", default="auto", help=DEVICE_HELP)
    a.add_argument("--trust-code", action="store_true", help=TRUST_HELP)

    p = sub.add_parser(
        "positions",
        help="position diagnostics: the sinusoid table, or a run's mean score by query-key offset "
        "(and its position bias against distance, for a scheme that biases scores)",
    )
    p.add_argument(
        "run_dir", nargs="?", help="a trained run (default: draw the sinusoid table instead)"
    )
    p.add_argument("--d", type=positive_int, help="sinusoid table width (default 4)")
    p.add_argument("--length", type=positive_int, help="sinusoid table positions (default 16)")
    p.add_argument(
        "--windows", type=positive_int, default=16, help="validation windows to average over"
    )
    p.add_argument(
        "--out",
        help="PNG file (default: runs/sinusoids.png, or RUN_DIR/score_by_offset.png; a run's bias "
        "against distance goes to RUN_DIR/bias_by_distance.png, or NAME_bias.png beside --out)",
    )
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    p.add_argument("--trust-code", action="store_true", help=TRUST_HELP)

    add_view_parser(sub, DEVICE_HELP)  # lm/explorer/flags.py

    d = sub.add_parser(
        "heads",
        help="score every attention head on a fixed probe (previous token, induction, duplicate "
        "token, first token) and the run's in-context learning score (docs/heads.md)",
    )
    d.add_argument("run_dir")
    d.add_argument("--step", type=int, help="the checkpoint of this step (default: the newest)")
    d.add_argument("--json", action="store_true", help="machine-readable output (docs/heads.md)")
    d.add_argument("--device", default="auto", help=DEVICE_HELP)

    x = sub.add_parser(
        "export",
        help="write a run as a Hugging Face transformers model folder (no custom code needed)",
    )
    x.add_argument("run_dir")
    x.add_argument("--out", required=True, help="the folder to write")
    x.add_argument(
        "--dtype",
        choices=["fp32", "bf16", "fp16"],
        default="fp32",
        help="precision of the exported weights (default fp32)",
    )
    x.add_argument("--checkpoint", metavar="NAME|PATH", help=CHECKPOINT_HELP)
    x.add_argument(
        "--max-positions",
        type=positive_int,
        help="longest sequence the export accepts (default: max(context_length, 2048); a "
        "learned table has exactly context_length)",
    )
    x.add_argument("--overwrite", action="store_true", help="replace an earlier export in --out")

    *some, last = (name for name, _ in MODELS.values())
    folder = f"a {', '.join(some)} or {last} model folder"
    i = sub.add_parser("import", help=f"turn {folder} (e.g. an export) into a run")
    i.add_argument("hf_dir", help="a folder with config.json, model.safetensors, tokenizer.json")
    i.add_argument("--out", required=True, help="the run directory to write")
    i.add_argument("--overwrite", action="store_true", help="replace an earlier run in --out")

    h = sub.add_parser(
        "choices",
        help="the steps lm compare --jobs auto timed here, and where they are kept",
    )
    h.add_argument("--clear", action="store_true", help="forget every kept timing")
    return parser


def _cmd_train(args: argparse.Namespace) -> int:
    from lm.api import train
    from lm.training.optim import without_dynamo_import

    without_dynamo_import()

    result = train(
        args.config,
        args.out,
        overrides=args.overrides,
        resume=args.resume,
        overwrite=args.overwrite,
        init_from=args.init_from,
        quiet=args.quiet,
        notes=None if args.quiet else lambda line: _say(line, alike=True),
        names=FLAGS,
    )
    code = {"done": 0, "target": 0, "interrupted": 130}.get(result.status, 1)
    if result.message:  # every process agreed on it: said once
        _say(f"lm: {result.message}", alike=True, code=code)
    return code


def _read_prompts(raw: list[str]) -> list[str]:
    """The ``--prompt`` values; ``-`` reads standard input once, without its final newline (the
    one a shell's echo or an editor adds)."""
    if raw.count("-") > 1:
        raise LMError("--prompt -: standard input can be read once; give '-' a single time")
    prompts = []
    for p in raw:
        where = "--prompt"
        if p == "-":
            where = "standard input"
            try:
                p = sys.stdin.read()
            except UnicodeDecodeError:
                raise LMError("standard input is not UTF-8 text") from None
            except OSError as e:
                raise LMError(f"cannot read the prompt from standard input ({e})") from None
            p = p[:-2] if p.endswith("\r\n") else p.removesuffix("\n")
        prompts.append(checked_text(p, where))
    return prompts


def _cmd_sample(args: argparse.Namespace) -> int:
    from lm.api import generate, load
    from lm.runtime.device import resolve_device

    device = str(resolve_device(args.device, "--device"))  # a wrong one named by its flag
    run = load(
        args.run_dir,
        checkpoint=args.checkpoint,
        device=device,
        rope_scaling=args.rope_scaling,
        names=FLAGS,
    )
    texts = _read_prompts(args.prompt)
    if args.temperature == 0.0:
        ignored = [
            flag
            for flag, value in (("--top-k", args.top_k), ("--seed", args.seed))
            if value is not None
        ]
        if ignored:
            print(
                f"lm: note: {' and '.join(ignored)} shape sampling (--temperature > 0); "
                "greedy decoding ignores them",
                file=sys.stderr,
            )
    if args.compile and args.no_kv_cache:
        note = "lm: note: --compile compiles the KV-cache step; --no-kv-cache has none"
        print(note, file=sys.stderr)
    for text in texts:
        unknown = run.tokenizer.count_unknown(text)
        if unknown:
            print(
                f"lm: {unknown} character(s) of the prompt are not in the vocabulary and became "
                "<unk>",
                file=sys.stderr,
            )
    outputs = generate(
        run,
        texts,
        args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        seed=args.seed,
        kv_cache=not args.no_kv_cache,
        compile=args.compile,
    )
    sys.stdout.write("\n\n".join(outputs) + "\n")
    sys.stdout.flush()
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    from lm.evaluate import evaluate_run, format_accuracy, format_table, setting_line
    from lm.runtime.device import resolve_device

    device = resolve_device(args.device, "--device")
    result = evaluate_run(
        args.run_dir,
        args.context_lengths,
        args.split,
        args.checkpoint,
        args.batch_size,
        str(device),
        args.max_batches,
        args.rope_scaling,
    )
    if args.rope_scaling is not None:
        print(setting_line(args.run_dir, args.rope_scaling))
    print(format_table(result["rows"]))
    if result["accuracy"] is not None:
        print("\nExact-match accuracy of the answers, by length:\n")
        print(format_accuracy(result["accuracy"]))
    return 0


def _cmd_heads(args: argparse.Namespace) -> int:
    import json

    from lm.evaluate_heads import format_heads, heads_of_run
    from lm.runtime.device import resolve_device

    device = str(resolve_device(args.device, "--device"))
    result = heads_of_run(args.run_dir, args.step, device)
    print(json.dumps(result, indent=2) if args.json else format_heads(result))
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from lm.compare.sweep import compare
    from lm.runtime.device import resolve_device
    from lm.training.optim import without_dynamo_import

    without_dynamo_import()  # a sweep's runs may train in this process

    if args.prompt is not None:
        checked_text(args.prompt, "--prompt")
    markdown = compare(
        args.paths,
        args.vary,
        args.seeds,
        args.overrides,
        args.out,
        quiet=args.quiet,
        rope_scaling=args.rope_scaling,
        eval_lengths=args.eval_lengths,
        prompt=args.prompt,
        max_new_tokens=args.max_new_tokens,
        eval_batches=args.eval_batches,
        device=str(resolve_device(args.device, "--device")),
        jobs=args.jobs,
        init_from=args.init_from,
    )
    print(markdown)
    return 0


def _cmd_attention(args: argparse.Namespace) -> int:
    from lm.compare.diagnostics import draw_attention
    from lm.runtime.device import resolve_device

    device = str(resolve_device(args.device, "--device"))
    text = checked_text(args.text, "--text")
    _check_text_fits(Path(args.run_dir), text)
    picture = draw_attention(args.run_dir, text, args.layer, args.head, args.out, device)
    print(picture.path)
    return 0


def _check_text_fits(run_dir: Path, text: str) -> None:
    """A learned position table has no vector past its rows: a longer ``--text`` is the text's
    to shorten (the model's own error would speak of its context). Anything else wrong with the
    run is left to the drawing to report."""
    from lm.data.tokenizer import TextTokenizer
    from lm.runs.code import read_run_config
    from lm.runs.directory import CONFIG, TOKENIZER

    if not ((run_dir / CONFIG).is_file() and (run_dir / TOKENIZER).is_file()):
        return
    model = read_run_config(run_dir).model
    if not any(r.table for r in model.rows):
        return
    tokens = len(TextTokenizer.load(run_dir / TOKENIZER).encode(text))
    if tokens > model.context_length:
        raise LMError(
            f"--text: {tokens} tokens, but this run's learned position table has "
            f"{model.context_length} positions; shorten --text to at most {model.context_length} "
            "tokens"
        )


def _cmd_positions(args: argparse.Namespace) -> int:
    from lm.compare.diagnostics import draw_bias_by_distance, draw_score_by_offset, draw_sinusoids
    from lm.runtime.device import resolve_device

    if args.run_dir is None:
        path = draw_sinusoids(args.d or 4, args.length or 16, args.out or "runs/sinusoids.png")
    elif args.d is not None or args.length is not None:
        raise LMError("--d and --length draw the sinusoid table: give them without RUN_DIR")
    else:
        device = str(resolve_device(args.device, "--device"))
        _, path = draw_score_by_offset(args.run_dir, args.out, args.windows, device)
        beside = None if args.out is None else Path(args.out)
        if beside is not None:
            beside = beside.with_name(f"{beside.stem}_bias{beside.suffix}")
        bias = draw_bias_by_distance(args.run_dir, beside, device)
        if bias is not None:
            print(bias)
    print(path)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from lm.hf.export import NAMES, export_run

    done = export_run(
        args.run_dir,
        args.out,
        dtype=args.dtype,
        checkpoint=args.checkpoint,
        overwrite=args.overwrite,
        max_positions=args.max_positions,
    )
    print(
        f"lm: step {done.step} exported as {NAMES[done.model_type]} ({args.dtype}, up to "
        f"{done.max_positions} positions)",
        file=sys.stderr,
    )
    print(done.out)
    return 0


def _cmd_import(args: argparse.Namespace) -> int:
    from lm.hf.importer import import_model

    done = import_model(args.hf_dir, args.out, overwrite=args.overwrite)
    print(f"lm: {done.summary()}", file=sys.stderr)
    print(done.out)
    return 0


def _cmd_choices(args: argparse.Namespace) -> int:
    from lm.runtime import choices

    path = choices.cache_file()
    if args.clear:
        print(f"lm: forgot {choices.clear()} kept timing(s) in {path}", file=sys.stderr)
        return 0
    entries, ignored = choices.load()
    ignored = f" ({ignored}: ignored)" if ignored else ""
    print(f"lm: {len(entries)} kept timing(s) in {path}{ignored}", file=sys.stderr)
    for row in choices.rows(entries):
        print(row)
    return 0


COMMANDS = {
    "train": _cmd_train,
    "sample": _cmd_sample,
    "eval": _cmd_eval,
    "compare": _cmd_compare,
    "bench": bench_command,
    "attention": _cmd_attention,
    "positions": _cmd_positions,
    "view": view_command,
    "heads": _cmd_heads,
    "export": _cmd_export,
    "import": _cmd_import,
    "choices": _cmd_choices,
}


def _say(line: str, alike: bool, code: int = 0) -> None:
    """Write one line to standard error, said once per job: under torchrun a line every process
    has alike (``alike``) is said by rank 0 alone, and the others, when they are to fail
    (``code``), wait for it first; a line of one process names its rank."""
    rank = launched_rank()
    if rank and alike:
        if code:
            time.sleep(LINGER_S)
        return
    if rank:
        line = f"lm: rank {rank}: {line.removeprefix('lm: ')}"
    sys.stderr.write(line + "\n")  # one write: the lines of several processes do not interleave
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.error(f"a command is required: {', '.join(COMMANDS)}")
    try:
        with trusting(getattr(args, "trust_code", False)):
            return COMMANDS[args.command](args)
    except LMError as e:
        sys.stderr.write(getattr(e, "frames", ""))  # an outside scheme's own, where it raised
        _say(f"lm: error: {one_line(str(e))}", every_rank_meets(e), 2)
        return 2
    except KeyboardInterrupt as e:
        said = f"; {one_line(str(e))}" if str(e) else ""  # e.g. what a sweep saved
        _say(f"lm: interrupted{said}", True, 130)  # a signal reaches every process
        return 130
    except BrokenPipeError:  # e.g. `lm sample ... | head`
        return 0
    except Exception as e:
        return _scheme_raised(e)


def _scheme_raised(e: Exception) -> int:
    """An error raised in the code of a position scheme written outside lm: its frames (not
    lm's: it is the user's code) and one line, exit 2; any other error is lm's, raised as is."""
    files, frames = user_files(), []
    while e.__traceback__ is not None:
        frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename in files]
        if frames or (e.__cause__ or e.__context__) is None:
            break
        e = e.__cause__ or e.__context__
    if not frames:
        raise
    sys.stderr.write("".join(traceback.format_list(frames)))
    what = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    _say(f"lm: error: {frames[-1].filename} raised {one_line(what)}", True, 2)
    return 2


if __name__ == "__main__":
    sys.exit(main())
