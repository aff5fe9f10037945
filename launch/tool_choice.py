"""Teacher-forced tool choice of one or more checkpoints on a corpus split (`hat_jax.eval.tool_choice`).

  python -m launch.tool_choice --checkpoints runs/demo/sft/checkpoints --corpus runs/demo/corpus
  python -m launch.tool_choice --corpus runs/demo/corpus \\
      --checkpoints runs/x/sft/checkpoints/50,runs/x/sft/checkpoints/100 --out runs/x/choice.json

For each checkpoint (a run's `checkpoints/` = its latest step, a step directory, or an HF
directory), every trained tool call of the first `max_conversations` records of the split is
scored teacher-forced: would greedy decoding from the gold prefix write the gold tool's name?
Printed per turn, per place in the turn and per tool, then the Skill each Skill-loader call
names (scored where the reasoning first writes it), per Skill, with the commonest wrong
choices of both; `--split train` scores records the policy trained on; `--out`
writes every report as one JSON file (atomically). Several step directories of one run give the
tool-choice learning curve of an SFT that the episode scores cannot show while they are zero.
Each checkpoint's in-context copying (`hat_jax.eval.copy_score`: random tokens shown twice, the
share of the second copy it predicts) comes with it: a policy that cannot copy from its context
cannot name a tool of its tool list.
"""

import pathlib

from absl import app, flags

_CHECKPOINTS = flags.DEFINE_list("checkpoints", None, "Checkpoint directories.", required=True)
_CORPUS = flags.DEFINE_string("corpus", "runs/demo/corpus", "Corpus directory (or record file).")
_SPLIT = flags.DEFINE_string("split", "dev", "The corpus split whose records are scored.")
_MAX = flags.DEFINE_integer("max_conversations", 32, "Records scored (the first ones).",
                            lower_bound=1)  # fmt: skip
_TOKENIZER = flags.DEFINE_string("tokenizer_dir", "", "Tokenizer (default: the checkpoint's).")
_MAX_LEN = flags.DEFINE_integer("max_len", 8192, "Rows longer than this are skipped (counted).")
_OUT = flags.DEFINE_string("out", "", "Write the reports here as JSON.")
_COPY = flags.DEFINE_integer("copy_samples", 8, "Rows of the in-context copying probe (0: off).",
                             lower_bound=0)  # fmt: skip


def main(argv):
    del argv
    import data
    from hat_jax import eval as hev
    from hat_jax import files
    from serve import convert, tokenizer_for

    conversations = data.read_conversations([_CORPUS.value], _SPLIT.value, limit=_MAX.value)
    n = len(conversations)
    if n == 0:
        raise app.UsageError(f"{_CORPUS.value}: no records in split {_SPLIT.value!r}")
    reports = {}
    for checkpoint in _CHECKPOINTS.value:
        if not pathlib.Path(checkpoint).exists():
            raise app.UsageError(f"checkpoint {checkpoint} does not exist")
        _, model = convert.load_checkpoint(checkpoint, dtype="float32", attention_impl="flash")
        tokenizer = tokenizer_for(checkpoint, _TOKENIZER.value or None)
        greedy_fn = hev.model_greedy_fn(model)
        report = hev.tool_choice(greedy_fn, conversations, tokenizer, max_len=_MAX_LEN.value)
        if _COPY.value:
            ids = hev.ordinary_token_ids(tokenizer)
            report["copy"] = hev.copy_score(greedy_fn, ids, samples=_COPY.value)
        reports[checkpoint] = report
        print(f"{checkpoint}: {report['rows']} rows of {n} {_SPLIT.value} records "
              f"({report['skipped_rows']} longer than {_MAX_LEN.value} skipped)")  # fmt: skip
        print(hev.format_tool_choice(report))
        if "copy" in report:
            copy = report["copy"]
            print(f"  in-context copying {100 * copy['accuracy']:.1f}% of {copy['tokens']} tokens "
                  f"(random tokens shown twice; chance {100 * copy['chance']:.2f}%)")  # fmt: skip
    if _OUT.value:
        files.write_json(_OUT.value, {"corpus": _CORPUS.value, "split": _SPLIT.value,
                                      "records": n, "reports": reports})  # fmt: skip
        print(f"-> {_OUT.value}")


if __name__ == "__main__":
    app.run(main)
