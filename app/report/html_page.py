"""The frame of report.html: one self-contained page (inline CSS, no script, no external fetch) under a
Content-Security-Policy that forbids everything but its own stylesheet, so even a mistake in escaping could
not load or run anything."""

from __future__ import annotations

import base64
import hashlib
from typing import Sequence, Tuple

# Class colours: the first (largest class, usually the waiting majority) is calm, minorities stand out.
# Each class also gets a symbol so the grid reads in print and without colour.
PALETTE: Tuple[Tuple[str, str], ...] = (
    ("#cfd8e3", "\u25cf"), ("#e4572e", "\u25b2"), ("#f3a712", "\u25a0"), ("#29bf12", "\u25c6"),
    ("#a846a0", "\u2605"), ("#00a5cf", "\u271a"), ("#ff66b3", "\u25bc"), ("#8c564b", "\u2b22"),
    ("#17becf", "\u2726"), ("#bcbd22", "\u25d0"), ("#7f7f7f", "\u2716"), ("#1f77b4", "\u25a3"),
)
NO_STACK = ("#ffffff", "\u00b7")

_BASE_CSS = """
:root{color-scheme:light;font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;font-size:15px;
  color:#1d232b;background:#fafbfc}
body{margin:0 auto;max-width:1200px;padding:1rem 1.5rem 4rem}
h1{font-size:1.5rem;margin:.2rem 0}h2{font-size:1.2rem;margin:2rem 0 .6rem;border-bottom:1px solid #d6dce3}
h3{font-size:1.02rem;margin:1rem 0 .4rem}
code,pre,.mono{font-family:ui-monospace,"SFMono-Regular",Menlo,Consolas,monospace;font-size:.86rem}
pre{background:#f1f3f6;padding:.6rem .8rem;overflow:auto;max-height:32rem;white-space:pre}
pre.wrap{white-space:pre-wrap;overflow-wrap:anywhere}
table{border-collapse:collapse;margin:.4rem 0}th,td{border:1px solid #d6dce3;padding:.2rem .5rem;
  text-align:left;vertical-align:top}th{background:#eef1f5}
.meta{color:#56606b}.verdict{font-size:1.15rem;background:#fff6dd;border-left:5px solid #f3a712;
  padding:.7rem 1rem;margin:1rem 0}
nav a{margin-right:.8rem}
.finding{border:1px solid #d6dce3;border-left:5px solid #7f7f7f;background:#fff;padding:.5rem .8rem;margin:.5rem 0}
.finding.high{border-left-color:#e4572e}.finding.medium{border-left-color:#f3a712}
.finding .why{color:#56606b;font-size:.9rem}
#culprit{border:2px solid #e4572e;background:#fff;padding:.4rem 1rem 1rem;margin:1rem 0}#culprit h2{margin-top:.4rem}
.grid{display:grid;grid-template-columns:max-content 1fr;gap:.25rem .8rem;align-items:center}
.cells{display:flex;flex-wrap:wrap;gap:3px}
.cell{display:inline-block;min-width:2.6rem;padding:.15rem .2rem;text-align:center;border:1px solid #9aa5b1;
  border-radius:3px;color:#1d232b;text-decoration:none;font-size:.8rem}
.cell.suspect{outline:3px solid #1d232b;outline-offset:1px;font-weight:bold}
.swatch{display:inline-block;min-width:1.6rem;text-align:center;border:1px solid #9aa5b1;border-radius:3px}
details{margin:.3rem 0}summary{cursor:pointer}
.tree ul{list-style:none;margin:0;padding-left:1.1rem;border-left:1px dotted #9aa5b1}
.tree>ul{border-left:none;padding-left:0}
.count{display:inline-block;min-width:3.2rem;color:#56606b}
.diverge{background:#ffe1d6}.same{color:#56606b}
.fail{color:#b3261e}.ok{color:#1e7b34}
.frames td.loc{white-space:nowrap}.locals{margin:.1rem 0 .3rem 1rem;color:#38424d}
.matrix td{text-align:center;min-width:3.5rem}
.timeline{width:100%;min-width:20rem}.track{background:#eef1f5;height:1rem;position:relative}
.bar{height:1rem;background:#9aa5b1}.bar.stuck{background:#e4572e}.bar.progressing{background:#29bf12}.bar.waiting,.bar.slow{background:#f3a712}
.bar.gone{background:#1d232b}
"""


def class_css(n_classes: int) -> str:
    """Per-class cell colours and symbols (`.k0` ... ; `.kx` for ranks without a stack)."""
    rules = []
    for i in range(n_classes):
        color, symbol = PALETTE[i % len(PALETTE)]
        rules.append(f".k{i}{{background:{color}}}.k{i}::before{{content:\"{symbol} \"}}")
    rules.append(f".kx{{background:{NO_STACK[0]};border-style:dashed}}.kx::before{{content:\"{NO_STACK[1]} \"}}")
    # timeline bars: offsets and widths in whole percent (style attributes are forbidden by the policy)
    rules.append("".join(f".o{p}{{margin-left:{p}%}}.w{p}{{width:{p}%}}" for p in range(101)))
    return "\n".join(rules)


def symbol(i: int) -> str:
    return PALETTE[i % len(PALETTE)][1] if i >= 0 else NO_STACK[1]


def page(title: str, body: Sequence[str], n_classes: int) -> str:
    """The whole document. The policy names the stylesheet by its hash: nothing else may load or run."""
    css = _BASE_CSS + class_css(n_classes) + "\n"
    digest = base64.b64encode(hashlib.sha256(css.encode("utf-8")).digest()).decode("ascii")
    policy = (f"default-src 'none'; style-src 'sha256-{digest}'; img-src 'none'; script-src 'none'; "
              "base-uri 'none'; form-action 'none'")
    return "".join([
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n",
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{policy}\">\n",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n",
        "<meta name=\"referrer\" content=\"no-referrer\">\n",
        f"<title>{title}</title>\n<style>{css}</style>\n</head>\n<body>\n",
        "\n".join(body),
        "\n</body></html>\n",
    ])
