"""Plain inline SVG charts for the dashboard: no script, no request leaves the site."""

from __future__ import annotations

from collections.abc import Sequence

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

WIDTH = 600
HEIGHT = 120
#: Room for the axis labels.
LEFT = 34
BOTTOM = 18


def per_minute(succeeded: Sequence[int], failed: Sequence[int], *, title: str) -> SafeString:
    """Bars of succeeded jobs per minute, failed ones stacked on top in red, the
    oldest minute left; the axis shows the busiest minute."""
    minutes = max(len(succeeded), 1)
    peak = max([s + f for s, f in zip(succeeded, failed, strict=True)] + [1])
    plot_w, plot_h = WIDTH - LEFT, HEIGHT - BOTTOM
    bar_w = plot_w / minutes
    bars = []
    for n, (ok, bad) in enumerate(zip(succeeded, failed, strict=True)):
        x = LEFT + n * bar_w
        ok_h = plot_h * ok / peak
        bad_h = plot_h * bad / peak
        minute = minutes - n - 1
        if ok:
            bars.append((f"{x:.1f}", f"{plot_h - ok_h:.1f}", f"{max(bar_w - 1, 1):.1f}",
                         f"{ok_h:.1f}", "ok", f"{ok} succeeded, {minute} min ago"))  # fmt: skip
        if bad:
            bars.append((f"{x:.1f}", f"{plot_h - ok_h - bad_h:.1f}", f"{max(bar_w - 1, 1):.1f}",
                         f"{bad_h:.1f}", "failed", f"{bad} failed, {minute} min ago"))  # fmt: skip
    rects = format_html_join(
        "",
        '<rect x="{}" y="{}" width="{}" height="{}" class="bar-{}"><title>{}</title></rect>',
        bars,
    )
    return format_html(
        '<svg class="ledon-chart" viewBox="0 0 {w} {h}" width="100%" role="img" '
        'aria-label="{title}"><title>{title}</title>'
        '<line x1="{left}" y1="{base}" x2="{w}" y2="{base}" class="axis"/>'
        '<line x1="{left}" y1="0" x2="{left}" y2="{base}" class="axis"/>'
        '<text x="{label_x}" y="10" class="tick">{peak}</text>'
        '<text x="{label_x}" y="{base}" class="tick">0</text>'
        '<text x="{left}" y="{bottom}" class="tick">-60 min</text>'
        '<text x="{w}" y="{bottom}" class="tick end">now</text>'
        "{rects}</svg>",
        w=WIDTH,
        h=HEIGHT,
        left=LEFT,
        base=plot_h,
        bottom=HEIGHT - 4,
        label_x=LEFT - 4,
        peak=peak,
        title=title,
        rects=rects,
    )
