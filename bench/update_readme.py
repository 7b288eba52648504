"""Copy the latest benchmark results into docs/performance.md.

The section between `<!-- bench:begin -->` and `<!-- bench:end -->` is replaced by the
newest bench/results/<date>.md (its title and plot link adjusted to work from docs/).
Run by `make bench` after the benchmarks; safe to run alone.
"""

import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def main() -> int:
    results = sorted(glob.glob(os.path.join(ROOT, "bench", "results", "*.md")))
    if not results:
        print("no results in bench/results/: run `make bench` first", file=sys.stderr)
        return 1
    latest = results[-1]
    body = open(latest).read()
    body = re.sub(r"^# .*\n", "", body, count=1)  # the page has its own heading
    body = re.sub(r"\]\((\d{4}-\d{2}-\d{2}\.png)\)", r"](../bench/results/\1)", body)
    body = re.sub(r"^## ", "### ", body, flags=re.M)
    source = os.path.relpath(latest, ROOT)
    section = f"{BEGIN}\n_Generated from `{source}` by `bench/update_readme.py`._\n\n{body.strip()}\n{END}"
    readme_path = os.path.join(ROOT, "docs", "performance.md")
    readme = open(readme_path).read()
    if BEGIN in readme:
        readme = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda m: section, readme,
                        flags=re.S)
    else:
        print("docs/performance.md has no bench markers", file=sys.stderr)
        return 1
    open(readme_path, "w").write(readme)
    print(f"docs/performance.md updated from {source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
