"""Is kforge's knowledge of an upstream current for its pin? The knobs forge.toml sets (``knobs_valid_for``) and
FlashInfer's arch-suffix rule (:data:`kforge.cuda.render.FLASHINFER_RULE_VALID_FOR`) were each checked for a range
of upstream versions; :func:`require_current_knowledge` refuses a plan whose pin is outside it."""

from __future__ import annotations

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from kforge.config.model import Project
from kforge.cuda.render import FLASHINFER_RULE_VALID_FOR
from kforge.errors import ConfigError


def require_current_knowledge(project: Project) -> None:
    """Refuse a plan whose upstream version is outside what kforge's knowledge of it was checked for.

    Two kinds: the project's knobs (``knobs_valid_for`` in forge.toml) and FlashInfer's arch-suffix
    rule (:data:`kforge.cuda.render.FLASHINFER_RULE_VALID_FOR`). A pin bump that outdates either fails
    here, loudly, instead of building with knobs upstream no longer reads.
    """
    version = Version(project.upstream_version) if project.upstream_version else None
    if project.knobs_valid_for is not None and version is not None and version not in SpecifierSet(project.knobs_valid_for):
        raise ConfigError(
            f"{project.name}'s knobs in forge.toml were checked for upstream {project.knobs_valid_for}, "
            f"and the pin is {project.upstream_version}",
            why="upstream may have renamed, dropped or added the variables kforge sets",
            fix=f"run `kforge audit {project.name}` on the new pin, fix the knobs it reports, then widen "
                f"projects.{project.name}.knobs_valid_for",
        )
    if project.variant_rule == "flashinfer":
        if version is None or version not in FLASHINFER_RULE_VALID_FOR:
            raise ConfigError(
                f"{project.name} uses FlashInfer's arch-suffix rule, which kforge knows for {FLASHINFER_RULE_VALID_FOR}, "
                f"and the pin is {project.upstream_version or 'of unknown version'}",
                why="the rule (flashinfer/compilation_context.py) changed between releases before; a wrong suffix "
                "builds the wrong cubins",
                fix="re-read compilation_context.py at the new pin and update kforge.cuda.render.default_variant "
                "and FLASHINFER_RULE_VALID_FOR" + ("" if version else f"; set projects.{project.name}.upstream_version"),
            )
