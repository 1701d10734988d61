"""Card faces, card backs and text, drawn with PIL (the original pastes PNG files; nothing is loaded here).

A face is a white rounded card with the rank and a small suit mark in the top-left and bottom-right
corners and a large suit mark in the middle; hearts and diamonds are red, spades and clubs black.
Suit marks are polygons and ellipses (no font has to carry the suit glyphs). The text font is PIL's
bundled one (``ImageFont.load_default(size)``), so drawings are identical on every machine.
"""

from __future__ import annotations

import functools

from PIL import Image, ImageDraw, ImageFont

SUITS = ("C", "D", "H", "S")  # the original's suit letters (card files "HQ.png", "S7.png", ...)
TABLE_GREEN = (0x35, 0x65, 0x4D)  # the original's background, '#35654d'
_RED = (200, 20, 30)
_BLACK = (20, 20, 20)
_BACK_BLUE = (30, 60, 150)


@functools.lru_cache(maxsize=64)
def font(size: int) -> ImageFont.FreeTypeFont:
    """PIL's bundled font at ``size`` pixels (cached)."""
    return ImageFont.load_default(size=max(6, int(size)))


def _suit_mark(draw: ImageDraw.ImageDraw, suit: str, cx: float, cy: float, s: float, color: tuple) -> None:
    """Draw the suit mark of half-height ``s`` centred at (cx, cy)."""
    r = s / 2
    if suit == "D":
        draw.polygon([(cx, cy - s), (cx + 0.72 * s, cy), (cx, cy + s), (cx - 0.72 * s, cy)], fill=color)
    elif suit == "H":
        for dx in (-r, r):
            draw.ellipse([cx + dx - r, cy - 0.5 * r - r, cx + dx + r, cy - 0.5 * r + r], fill=color)
        draw.polygon([(cx - 2 * r, cy - 0.35 * r), (cx + 2 * r, cy - 0.35 * r), (cx, cy + s)], fill=color)
    elif suit == "S":
        for dx in (-r, r):
            draw.ellipse([cx + dx - r, cy + 0.3 * r - r, cx + dx + r, cy + 0.3 * r + r], fill=color)
        draw.polygon([(cx - 2 * r, cy + 0.15 * r), (cx + 2 * r, cy + 0.15 * r), (cx, cy - s)], fill=color)
        draw.polygon([(cx, cy + 0.2 * r), (cx - 0.6 * r, cy + s), (cx + 0.6 * r, cy + s)], fill=color)
    elif suit == "C":
        q = 0.62 * r
        for ox, oy in ((0.0, -0.95 * r), (-0.9 * r, 0.2 * r), (0.9 * r, 0.2 * r)):
            draw.ellipse([cx + ox - q * 1.25, cy + oy - q * 1.25, cx + ox + q * 1.25, cy + oy + q * 1.25], fill=color)
        draw.polygon([(cx, cy - 0.2 * r), (cx - 0.6 * r, cy + s), (cx + 0.6 * r, cy + s)], fill=color)
    else:
        raise ValueError(f"unknown suit {suit!r}; expected one of {SUITS}")


@functools.lru_cache(maxsize=512)
def card_face(rank: str, suit: str, width: int, height: int) -> Image.Image:
    """The face of one card (RGB, ``width`` x ``height``); ``rank`` as printed (``"A"``, ``"10"``, ``"K"``).

    Cached: callers paste it and never draw on it.
    """
    img = Image.new("RGB", (width, height), TABLE_GREEN)
    draw = ImageDraw.Draw(img)
    radius = max(2, width // 10)
    draw.rounded_rectangle(
        [0, 0, width - 1, height - 1], radius=radius, fill="white", outline=(90, 90, 90), width=max(1, width // 50)
    )
    color = _RED if suit in ("H", "D") else _BLACK
    corner = font(max(8, int(height * 0.19)))
    margin = max(2, width // 14)
    draw.text((margin, margin), rank, fill=color, font=corner)
    small = max(2.0, height * 0.06)
    _suit_mark(draw, suit, margin + small, margin + height * 0.24 + small, small, color)
    # bottom-right corner, upright (PIL's bundled font is not rotated: legibility over fidelity)
    left, top, right, bottom = draw.textbbox((0, 0), rank, font=corner)
    draw.text(
        (width - margin - (right - left) - left, height - margin - (bottom - top) - top), rank, fill=color, font=corner
    )
    _suit_mark(draw, suit, width - margin - small, height - margin - height * 0.24 - small, small, color)
    _suit_mark(draw, suit, width / 2, height / 2, min(width, height) * 0.22, color)
    return img


@functools.lru_cache(maxsize=32)
def card_back(width: int, height: int) -> Image.Image:
    """A face-down card (the dealer's hole card): blue with a white frame and a lattice."""
    img = Image.new("RGB", (width, height), TABLE_GREEN)
    draw = ImageDraw.Draw(img)
    radius = max(2, width // 10)
    draw.rounded_rectangle([0, 0, width - 1, height - 1], radius=radius, fill="white", outline=(90, 90, 90))
    inset = max(3, width // 12)
    inner_w, inner_h = width - 2 * inset, height - 2 * inset
    inner = Image.new("RGB", (inner_w, inner_h), _BACK_BLUE)
    lattice = ImageDraw.Draw(inner)
    step = max(4, width // 7)
    for k in range(-inner_h, inner_w + inner_h, step):
        lattice.line([(k, 0), (k + inner_h, inner_h)], fill=(90, 120, 210), width=1)
        lattice.line([(k, inner_h), (k + inner_h, 0)], fill=(90, 120, 210), width=1)
    img.paste(inner, (inset, inset))
    return img
