"""``mi-core separability``: prune what the cripple data set uses more than the focus data set.

Writes ``trajectory.csv``, ``summary.json``, ``figures.html``, ``masks.safetensors`` and
``pruned.json`` (and ``random_masks.safetensors`` with ``--random``) into ``--out``; the state
after every step goes to ``--out/state.safetensors``, so the same command re-run after a crash
goes on from the last finished step.
"""

from __future__ import annotations

import argparse
import logging

from mi_core.errors import ConfigError

log = logging.getLogger(__name__)


def add_parser(subparsers) -> None:
    """Register ``separability``."""
    from mi_core.separability.prune import OFFSETS
    from mi_core.separability.scoring import HEAD_AGGREGATIONS, SCHEDULES, SCORINGS
    from mi_core.separability.trajectory import MODES

    p = subparsers.add_parser(
        "separability",
        help="iterative separability pruning (focus vs cripple data set)",
        description="Iterative separability pruning: remove the neurons the cripple data set "
        "uses more than the focus data set, step by step, and measure both.",
    )
    p.add_argument(
        "--config",
        default=None,
        help="a JSON file, or a shipped config name (mi_core/configs/separability: "
        "opt-1.3b-pile-code carries the report's settings, smollm2-wikitext-python the local "
        "ones), whose keys (the options below, with _ for -) set the defaults; flags given on "
        "the command line override it",
    )
    p.add_argument("--model", default=None, help="model name (e.g. smollm2) or checkpoint path")
    p.add_argument("--focus", default=None, help="data set to keep, e.g. text:wikitext")
    p.add_argument("--cripple", default=None, help="data set to remove, e.g. text:python")
    p.add_argument("--out", default=None, help="output directory (also the resume state)")
    p.add_argument("--steps", type=int, default=20, help="pruning steps (default 20)")
    p.add_argument(
        "--ff-frac",
        type=float,
        default=0.05,
        help="fraction of the MLP neurons removed per step (default 0.05; see --schedule)",
    )
    p.add_argument(
        "--attn-frac",
        type=float,
        default=0.0,
        help="fraction of the attention units removed per step (default 0; see --schedule)",
    )
    p.add_argument(
        "--schedule",
        choices=list(SCHEDULES),
        default="total",
        help="total: each step removes the fraction of all units, so 1/frac steps prune "
        "everything (the report); remaining: the fraction of the units left (default total)",
    )
    p.add_argument(
        "--ff-scoring",
        choices=list(SCORINGS),
        default="freq",
        help="how MLP neurons are scored (default freq, the report's)",
    )
    p.add_argument(
        "--attn-scoring",
        choices=list(SCORINGS),
        default="abs",
        help="how attention pre-out neurons are scored (default abs, the report's)",
    )
    p.add_argument(
        "--scoring",
        choices=list(SCORINGS),
        default=None,
        help="shorthand: set --ff-scoring and --attn-scoring both",
    )
    p.add_argument(
        "--attn-unit",
        choices=["neuron", "head"],
        default="neuron",
        help="prune attention pre-out neurons or whole heads (default neuron)",
    )
    p.add_argument(
        "--attn-heads-per-step",
        type=int,
        default=0,
        help="with --attn-unit head: remove this many heads per step instead of --attn-frac",
    )
    p.add_argument(
        "--head-aggregation",
        choices=list(HEAD_AGGREGATIONS),
        default="mean",
        help="how neuron scores make a head score with --attn-unit head",
    )
    p.add_argument(
        "--ff-offset",
        choices=list(OFFSETS),
        default="zero",
        help="replace removed MLP neurons by zero or their focus mean (default zero)",
    )
    p.add_argument(
        "--attn-offset",
        choices=list(OFFSETS),
        default="mean",
        help="replace removed pre-out neurons by zero or their focus mean (default mean)",
    )
    p.add_argument(
        "--offset",
        choices=list(OFFSETS),
        default=None,
        help="shorthand: set --ff-offset and --attn-offset both",
    )
    p.add_argument("--svd", action="store_true", help="rewrite attention W_V/W_O in OV-SVD basis")
    p.add_argument(
        "--svd-combine-biases",
        action="store_true",
        help="with --svd: fold the value biases into the output bias first",
    )
    p.add_argument(
        "--mode",
        choices=list(MODES),
        default="cripple",
        help="trajectory orientation: cripple (x = cripple set) or focus (x = focus)",
    )
    p.add_argument("--random", action="store_true", help="also run the random baseline")
    p.add_argument(
        "--correct-top-k",
        type=int,
        default=0,
        help="collect statistics only where the next token is in the model's top k (0: all)",
    )
    p.add_argument(
        "--tokens",
        type=int,
        default=100_000,
        help="statistics tokens per data set (default 100000)",
    )
    p.add_argument(
        "--eval-tokens",
        type=int,
        default=None,
        help="held-out tokens per data set for metrics (default: --tokens)",
    )
    p.add_argument("--window", type=int, default=128, help="tokens per window (default 128)")
    p.add_argument(
        "--eval-protocol",
        choices=["windows", "texts"],
        default="windows",
        help="windows: metrics on fixed held-out windows of --window tokens (default); texts: "
        "the report's protocol, each held-out text up to --text-tokens tokens after a start "
        "token, --eval-tokens predictions in all, the loss averaged per text",
    )
    p.add_argument(
        "--text-tokens", type=int, default=1000, help="tokens per text with --eval-protocol texts"
    )
    p.add_argument("--batch-size", type=int, default=8, help="windows per forward pass")
    p.add_argument("--seed", type=int, default=0, help="seed of the random baseline")
    p.add_argument("--eps", type=float, default=1e-6, help="epsilon of the score ratio")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run, parser=p)


def _windows(tokenizer, spec: str, window: int, n_tokens: int, split: str):
    from mi_core.data import token_windows

    windows = token_windows(tokenizer, spec, window=window, split=split)
    wanted = max(1, n_tokens // window)
    if windows.shape[0] < wanted:
        log.warning(
            "%s: %s part has %d windows of %d tokens; using all of them (%d asked for)",
            spec,
            split,
            windows.shape[0],
            window,
            wanted,
        )
    return windows[:wanted]


def _task(tokenizer, spec: str, args: argparse.Namespace, eval_tokens: int):
    """One data set's statistics windows and held-out part (windows or whole texts)."""
    from mi_core.data import token_texts
    from mi_core.separability import TaskTokens

    stats = _windows(tokenizer, spec, args.window, args.tokens, "stats")
    if args.eval_protocol == "texts":
        heldout, mask = token_texts(tokenizer, spec, args.text_tokens, eval_tokens, "heldout")
        return TaskTokens(name=spec, stats=stats, heldout=heldout, heldout_mask=mask)
    heldout = _windows(tokenizer, spec, args.window, eval_tokens, "heldout")
    return TaskTokens(name=spec, stats=stats, heldout=heldout)


SHIPPED = "configs/separability"


def shipped_separability_configs() -> list[str]:
    """Names of the separability configs shipped with mi_core."""
    from importlib import resources

    root = resources.files("mi_core") / SHIPPED
    return sorted(p.name[: -len(".json")] for p in root.iterdir() if p.name.endswith(".json"))


def apply_config(args: argparse.Namespace) -> argparse.Namespace:
    """Set the options ``--config`` names, except those given as flags on the command line."""
    import json
    from importlib import resources
    from pathlib import Path

    if args.config is None:
        return args
    path = Path(args.config).expanduser()
    if not path.is_file():
        name = args.config.removesuffix(".json")
        if name not in shipped_separability_configs():
            raise ConfigError(
                f"no config file or shipped separability config named {args.config!r}; "
                f"shipped: {', '.join(shipped_separability_configs())}"
            )
        path = Path(str(resources.files("mi_core") / SHIPPED / f"{name}.json"))
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read separability config {path}: {exc}") from None
    actions = {a.dest: a for a in args.parser._actions if a.option_strings}
    given = {
        a.dest
        for a in actions.values()
        for token in getattr(args, "argv", [])
        if token.split("=", 1)[0] in a.option_strings
    }
    values.pop("description", None)
    unknown = sorted(set(values) - set(actions) - {"config"})
    if unknown:
        raise ConfigError(f"{path.name}: unknown keys {unknown}; use the option names with _")
    for key, value in values.items():
        if key not in given:
            setattr(args, key, value)
    return args


def run(args: argparse.Namespace) -> None:
    """Load the model and data, run (or resume) the pruning, write the outputs."""
    from pathlib import Path

    from mi_core.models import load_model
    from mi_core.separability import SeparabilityConfig, run_separability
    from mi_core.separability.prune import check_state
    from mi_core.separability.report import write_separability_outputs

    apply_config(args)
    missing = [f"--{k}" for k in ("model", "focus", "cripple", "out") if not getattr(args, k)]
    if missing:
        raise ConfigError(f"separability needs {', '.join(missing)} (as flags or in --config)")
    if args.tokens < args.window or (
        args.eval_tokens is not None and args.eval_tokens < args.window
    ):
        raise ConfigError(f"--tokens and --eval-tokens must be at least --window ({args.window})")
    config = SeparabilityConfig(
        steps=args.steps,
        ff_frac=args.ff_frac,
        attn_frac=args.attn_frac,
        ff_scoring=args.ff_scoring,
        attn_scoring=args.attn_scoring,
        scoring=args.scoring,
        schedule=args.schedule,
        attn_unit=args.attn_unit,
        attn_heads_per_step=args.attn_heads_per_step,
        head_aggregation=args.head_aggregation,
        ff_offset=args.ff_offset,
        attn_offset=args.attn_offset,
        offset=args.offset,
        svd=args.svd,
        svd_combine_biases=args.svd_combine_biases,
        eval_protocol=args.eval_protocol,
        stats_correct_top_k=args.correct_top_k,
        mode=args.mode,
        random_baseline=args.random,
        seed=args.seed,
        eps=args.eps,
        batch_size=args.batch_size,
    ).validate()
    eval_tokens = args.eval_tokens or args.tokens
    identity = {
        "model": str(args.model),
        "focus": args.focus,
        "cripple": args.cripple,
        "tokens": args.tokens,
        "eval_tokens": eval_tokens,
        "window": args.window,
    }
    if args.eval_protocol == "texts":
        identity["text_tokens"] = args.text_tokens
    out = Path(args.out)
    state_path = out / "state.safetensors"
    done = check_state(state_path, config, identity)  # fails fast on a mismatched state
    if done >= 0:
        log.info("resuming %s after step %d of %d", out, done, config.steps)
    model = load_model(args.model, device=args.device)
    if not hasattr(model, "unembed") or getattr(model, "tokenizer", None) is None:
        raise ConfigError(f"{args.model} is not a causal language model with a tokenizer")
    tasks = {
        role: _task(model.tokenizer, spec, args, eval_tokens)
        for role, spec in (("focus", args.focus), ("cripple", args.cripple))
    }
    out = Path(args.out)
    result = run_separability(
        model,
        tasks["focus"],
        tasks["cripple"],
        config,
        state_path=out / "state.safetensors",
        identity=identity,
        progress=not args.no_progress,
    )
    paths = write_separability_outputs(result, out, extra_summary=identity)
    summary = result.summary()
    for metric in ("top1", "skip50_top1"):
        area = summary["areas"][metric]
        line = f"{metric}: area {area['area']:.3f}, separability {area['separability_pct']:.1f}%"
        if "random_areas" in summary:
            line += f" (random: area {summary['random_areas'][metric]['area']:.3f})"
        print(line)
    for finding in summary["findings"]:
        print(
            f"{finding['finding']}: {finding['verdict']} ({finding['this run']}; the report: "
            f"{finding['paper']})"
        )
    print(f"wrote {', '.join(p.name for p in paths.values())} to {out}")
