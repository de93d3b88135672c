"""Jinja rendering of GLSL variants and stub modules, with errors mapped to template lines.

One `Renderer` per run: a Jinja environment on the templates folders, the
caller's first and then the built-in ones (`builtin_templates()`: the stub
template and the GLSL includes a user's templates may include), with
StrictUndefined, trim_blocks, lstrip_blocks, keep_trailing_newline; filters
only from `naming`/`glsl`. Template syntax errors and render errors become
`SpecError`s at the template file:line (the caller says what it was
rendering). `source_location` maps a line of rendered output back to the
template line it came from, following `{% include %}`s into the included file
(by matching rendered lines against the templates' literal text), so glslc
errors can name the template line. Must not write files or compute ABI
details. Called by `build.py`.
"""

from __future__ import annotations

import re
import traceback
from pathlib import Path

import jinja2

from codegen import glsl, naming
from codegen.errors import Location, SpecError

FILTERS = {
    "short": naming.short_value,
    "vec4_type": glsl.vec4_type,
    "scalar_type": glsl.scalar_type,
    "image_format": glsl.image_format,
}


def builtin_templates() -> Path:
    """The built-in templates: ``codegen/templates`` in an installed wheel, else the checkout's."""
    packaged = Path(__file__).resolve().parent / "templates"
    return packaged if packaged.is_dir() else Path(__file__).resolve().parents[1] / "templates"


class Renderer:
    """Renders templates from `templates_dir`, then the built-in folder; messages name a
    template as ``<folder name>/<template>``."""

    def __init__(self, templates_dir: Path):
        self.dir = Path(templates_dir)
        self.dirs = [self.dir]
        if builtin_templates().resolve() != self.dir.resolve():
            self.dirs.append(builtin_templates())
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader([str(d) for d in self.dirs]),
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
            keep_trailing_newline=True,
            autoescape=False,
        )
        self.env.filters.update(FILTERS)
        self._cache: dict[str, jinja2.Template | SpecError] = {}
        self._patterns: dict[str, list[tuple[re.Pattern | None, Location]]] = {}

    def _folder(self, name: str) -> Path:
        """The first folder holding template `name` (the caller's when none does)."""
        return next((d for d in self.dirs if (d / name).is_file()), self.dir)

    def path(self, name: str) -> str:
        """Display path of a template, e.g. templates/quantize.glsl.j2."""
        return f"{self._folder(name).name}/{name}"

    def template(self, name: str, used_at: Location) -> jinja2.Template | SpecError:
        """The compiled template, or the error that prevents it."""
        if name not in self._cache:
            try:
                self._cache[name] = self.env.get_template(name)
            except jinja2.TemplateNotFound as e:
                missing = e.name or name
                where = used_at if missing == name else Location(self.path(name), 1, 1)
                self._cache[name] = SpecError(
                    where,
                    f"template '{missing}' not found in {self.dir.name}/"
                    f"{' or the built-in templates' if len(self.dirs) > 1 else ''}; "
                    "create it or fix the name",
                )
            except jinja2.TemplateSyntaxError as e:
                file = self._display_file(e.filename, e.name or name)
                self._cache[name] = SpecError(
                    Location(file, e.lineno or 1, 1), f"template syntax error: {e.message}"
                )
        return self._cache[name]

    def _display_file(self, filename: str | None, name: str) -> str:
        relative = self._relative(filename) if filename else None
        return self.path(relative or name)

    def _relative(self, filename: str) -> str | None:
        """`filename` relative to the template folder holding it, or None."""
        for folder in self.dirs:
            try:
                return Path(filename).resolve().relative_to(folder.resolve()).as_posix()
            except ValueError:
                continue
        return None

    def render(self, name: str, context: dict, used_at: Location):
        """Renders a template; returns (text or None, error or None)."""
        template = self.template(name, used_at)
        if isinstance(template, SpecError):
            return None, template
        try:
            return template.render(context), None
        except Exception as e:  # any error inside a template is the template author's
            line, file = 1, self.path(name)
            for frame, lineno in traceback.walk_tb(e.__traceback__):
                rel = self._relative(frame.f_code.co_filename)
                if rel is not None:
                    line, file = lineno, self.path(rel)
            message = getattr(e, "message", None) or str(e)
            kind = (
                "undefined template variable"
                if isinstance(e, jinja2.UndefinedError)
                else (f"template error ({type(e).__name__})")
            )
            return None, SpecError(Location(file, line, 1), f"{kind}: {message}")

    def source_location(self, name: str, rendered: str, line: int) -> Location | None:
        """The template line (of `name` or a file it includes) that produced line `line`
        (1-based) of `rendered`, or None if no template line matches."""
        patterns = self._line_patterns(name)
        if not patterns:
            return None
        cursor = 0
        found = None
        for i, text in enumerate(rendered.splitlines()[:line], start=1):
            hit = _search(patterns, text, cursor)
            if hit is not None:
                cursor = hit
                if i == line:
                    found = patterns[hit][1]
        return found

    def _line_patterns(self, name: str, depth: int = 0) -> list[tuple[re.Pattern | None, Location]]:
        """One (pattern, source line) per template line, included files expanded in place."""
        if name not in self._patterns:
            try:
                source = (self._folder(name) / name).read_text(encoding="utf-8")
            except OSError:
                source = ""
            patterns = []
            for i, text in enumerate(source.splitlines(), start=1):
                included = _INCLUDE.match(text)
                if included and depth < 8:
                    patterns += self._line_patterns(included.group(1), depth + 1)
                else:
                    patterns.append((_line_pattern(text), Location(self.path(name), i)))
            self._patterns[name] = patterns
        return self._patterns[name]


_EXPR = re.compile(r"\{\{.*?\}\}")
_STMT = re.compile(r"^\s*(\{%.*?%\}|\{#.*?#\})\s*$")
_INCLUDE = re.compile(r"""\s*\{%-?\s*include\s+["']([^"']+)["']\s*-?%\}\s*\Z""")


def _line_pattern(source_line: str) -> re.Pattern | None:
    stripped = source_line.strip()
    if not stripped or _STMT.match(source_line) or stripped.startswith(("{#", "{%")):
        return None
    parts = _EXPR.split(stripped)
    if len("".join(parts).strip()) < 2:
        return None
    return re.compile(r"\s*" + ".*?".join(re.escape(p) for p in parts) + r"\s*\Z")


def _search(patterns, text: str, cursor: int) -> int | None:
    if not text.strip():
        return None
    n = len(patterns)
    for k in range(n):
        i = (cursor + k) % n
        p = patterns[i][0]
        if p is not None and p.match(text):
            return i
    return None
