"""A server-rendered SVG bar chart of hourly outcomes: no JavaScript, no external assets."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from kumiko_jobs.lane_stats import Hour

WIDTH, HEIGHT, LEFT, BOTTOM, TOP = 720, 170, 44, 22, 8
# Stacked bottom to top; colours match the run browser's status badges.
SERIES = (("succeeded", "#15803d"), ("failed", "#b91c1c"), ("retried", "#b45309"), ("deferred", "#64748b"))


def outcome_chart(hours: Sequence[Hour], *, label: str) -> SafeString:
    """Stacked bars, one per hour: succeeded, failed (finally), retried and deferred attempts."""
    peak = max((sum(hour.get(name) for name, _ in SERIES) for hour in hours), default=0)
    scale = _nice_ceiling(peak)
    plot_w, plot_h = WIDTH - LEFT - 4, HEIGHT - BOTTOM - TOP
    slot = plot_w / max(len(hours), 1)
    bars: list[tuple[float, float, float, float, str, str]] = []
    ticks: list[tuple[float, float, str]] = []
    for index, hour in enumerate(hours):
        x = LEFT + index * slot + 1
        base = float(TOP + plot_h)
        start = timezone.localtime(datetime.fromtimestamp(hour.start, UTC))
        for name, color in SERIES:
            count = hour.get(name)
            if not count:
                continue
            height = plot_h * count / scale
            base -= height
            tip = f"{start:%H:00}: {count:,} {name}"
            bars.append((round(x, 1), round(base, 1), round(slot - 2, 1), round(height, 1), color, tip))
        if index % 3 == 0:
            ticks.append((round(x + slot / 2, 1), HEIGHT - 6, f"{start:%H:00}"))
    legend = format_html_join(
        "", '<tspan fill="{}" dx="10">■</tspan><tspan dx="3">{}</tspan>', ((c, n) for n, c in SERIES)
    )
    return format_html(
        '<svg class="kj-chart" role="img" aria-label="{label}" viewBox="0 0 {w} {h}" width="100%" '
        'style="max-width:{w}px" xmlns="http://www.w3.org/2000/svg" font-size="10" font-family="sans-serif">'
        "<title>{label}</title>"
        '<line x1="{left}" y1="{top}" x2="{left}" y2="{axis}" stroke="#999"/>'
        '<line x1="{left}" y1="{axis}" x2="{right}" y2="{axis}" stroke="#999"/>'
        '<text x="{tx}" y="{ty}" text-anchor="end">{scale}</text>'
        '<text x="{tx}" y="{axis}" text-anchor="end">0</text>'
        "{bars}{ticks}"
        '<text x="{lx}" y="{ly}" fill="#444">{legend}</text>'
        "</svg>",
        label=label, w=WIDTH, h=HEIGHT, left=LEFT, top=TOP, axis=TOP + plot_h, right=WIDTH - 4,
        tx=LEFT - 4, ty=TOP + 8, scale=f"{scale:,}", lx=LEFT + 4, ly=TOP + 8, legend=legend,
        bars=format_html_join(
            "", '<rect x="{}" y="{}" width="{}" height="{}" fill="{}"><title>{}</title></rect>', bars
        ),
        ticks=format_html_join("", '<text x="{}" y="{}" text-anchor="middle">{}</text>', ticks),
    )  # fmt: skip


def _nice_ceiling(value: int) -> int:
    """1, 2 or 5 times a power of ten, at least ``value`` (and at least 1)."""
    if value <= 1:
        return 1
    magnitude = 1
    while magnitude * 10 <= value:
        magnitude *= 10
    for step in (1, 2, 5, 10):
        if step * magnitude >= value:
            return step * magnitude
    return 10 * magnitude
