"""Checks of a report's page and pictures: what a browser would load and what a person would see."""
from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

from PIL import Image


class PageParser(HTMLParser):
    """Collects tags, attributes and text of a page as a browser's tokenizer sees them."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def parse_page(path: Path) -> PageParser:
    parser = PageParser()
    parser.feed(path.read_text(encoding="utf-8"))
    parser.close()
    return parser


def assert_safe_page(page: Path) -> PageParser:
    """No script, no event handler, no link leaving the report folder, every linked file present."""
    parsed = parse_page(page)
    tags = [t for t, _ in parsed.tags]
    assert "script" not in tags and "iframe" not in tags and "object" not in tags and "base" not in tags
    for tag, attrs in parsed.tags:
        assert not any(name.startswith("on") for name in attrs), (tag, attrs)
        for name in ("src", "href"):
            if name in attrs:
                link = attrs[name]
                assert "/" not in link and ":" not in link and not link.startswith("."), link
                assert (page.parent / link).is_file(), link
    csp = [a for t, a in parsed.tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"]
    assert csp and "default-src 'none'" in csp[0]["content"] and "script" not in csp[0]["content"]
    return parsed


def assert_png(path: Path, min_size=(200, 100)) -> Image.Image:
    """A PNG that decodes, is at least min_size and is not blank."""
    with Image.open(path) as image:
        assert image.format == "PNG"
        image.load()
        image = image.convert("RGB")
    assert image.width >= min_size[0] and image.height >= min_size[1], image.size
    colors = image.getcolors(maxcolors=1 << 20)
    assert colors is None or len(colors) > 8, f"{path.name} is blank"
    extrema = image.convert("L").getextrema()
    assert extrema[1] - extrema[0] > 100, f"{path.name} has no contrast"
    return image
