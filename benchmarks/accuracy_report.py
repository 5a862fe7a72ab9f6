"""Markdown accuracy tables for the README, from the same code as `paraplan validate-published`.

Run: python benchmarks/accuracy_report.py
"""

from __future__ import annotations

from paraplan.validate.predict import run_memory, run_published
from paraplan.validate.published import DATA_DIR


def table(result: dict, title: str, key: str = "by_source", label: str = "source") -> str:
    lines = [f"**{title}**", "",
             f"| {label} | rows | predicted | MAPE % | MAPE % (plan stated) | worst row (error) |",
             "|---|---:|---:|---:|---:|---|"]
    for src, info in result[key].items():
        worst = info.get("worst_row")
        mape = "-" if info["mape_pct"] is None else f"{info['mape_pct']:.1f}"
        cert = "-" if info.get("mape_pct_certain") is None else f"{info['mape_pct_certain']:.1f}"
        w = "-" if not worst else f"#{worst['index']} {worst['model']} ({worst['error_pct']:+.1f}%)"
        lines.append(f"| {src} | {info.get('n_rows', '')} | {info['n']} | {mape} | {cert} | {w} |")
    overall = result["mape_pct"]
    cert = result.get("mape_pct_certain")
    lines.append(f"| **all** | {result['n_rows']} | {result['n_predicted']} | "
                 f"**{overall:.1f}** | {'-' if cert is None else f'{cert:.1f}'} | "
                 f"coverage {result.get('coverage_pct', 0):.0f}% |")
    return "\n".join(lines)


def main() -> None:
    published = run_published()
    print(table(published, "published_throughput.csv (shared/validation), error on step time"))
    print()
    print(table(published, "the same rows by GPU type", "by_gpu", "GPU"))
    print()
    print(table(run_published(str(DATA_DIR / "holdout" / "holdout_throughput.csv")),
                "hold-out runs (paraplan/validate/data/holdout), error on step time"))
    print()
    mem = run_memory()
    print(table(mem, "published_memory.csv, error on GiB (or % of the TP-only baseline)"))
    measured = [r for r in mem["rows"] if r["status"] == "ok"
                and r.get("measured_or_analytical") == "measured"]
    if measured:
        mape = sum(abs(r["error_pct"]) for r in measured) / len(measured)
        print(f"\nMeasured memory rows only: {len(measured)} rows, MAPE {mape:.1f}%")


if __name__ == "__main__":
    main()
