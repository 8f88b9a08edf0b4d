"""invoke tasks for the developer chores that aren't builds (`invoke --list`). Thin: each calls `kforge`."""

import shlex
import sys

from invoke import Collection, task

KFORGE = f"{shlex.quote(sys.executable)} -m kforge.cli"


def _kforge(c, *words):
    # kforge prints its own one-paragraph error; invoke then exits with kforge's code (2 config, 11 publish, ...)
    return c.run(" ".join([KFORGE, *map(shlex.quote, words)]), pty=False)


@task(help={"project": "only this project"})
def externals_status(c, project=None):
    """Each upstream source: pinned, missing, dirty or at the wrong commit (and the command that fixes it)."""
    _kforge(c, "sources", "status", *([project] if project else []))


@task(help={"project": "only this project"})
def externals_sync(c, project=None):
    """Initialise the git submodules and check out the pinned commits; fetch and verify pinned sdists."""
    _kforge(c, "sources", "sync", *([project] if project else []))


@task(help={"project": "only this project", "mirror": "a directory of local git mirrors (also $KFORGE_GIT_MIRROR)"})
def externals_verify(c, project=None, mirror=None):
    """Is each git pin on a branch or tag of its upstream (not only a pull-request ref)?"""
    _kforge(c, "sources", "verify", *([project] if project else []), *(["--mirror", mirror] if mirror else []))


@task(help={"out": "the kit folder to write", "project": "only this project"})
def externals_kit(c, out, project=None):
    """Gather wheels, pinned sdists and git trees into one folder for an offline build host."""
    _kforge(c, "sources", "kit", "build", out, *(["--project", project] if project else []))


@task(help={"project": "project whose patch series to show"})
def patches_status(c, project):
    """Per patch: applies cleanly / already applied / fails (with the file and hunk)."""
    _kforge(c, "patches", "status", project)


@task(help={"project": "project whose patch series to apply", "tree": "the tree to patch"})
def patches_apply(c, project, tree=None):
    """Apply the series atomically to a scratch tree (all or nothing; never into externals/)."""
    _kforge(c, "patches", "apply", project, *(["--tree", tree] if tree else []))


@task(help={"project": "project whose series to regenerate", "branch": "the rebased working branch"})
def patches_refresh(c, project, branch=None):
    """Regenerate patches/<project>/ from a working branch rebased onto a new pin."""
    _kforge(c, "patches", "refresh", project, *(["--branch", branch] if branch else []))


@task
def wheelhouse_index(c):
    """Rebuild the PEP 503 simple/ index of wheelhouse/ from the manifests."""
    _kforge(c, "wheelhouse", "index")


@task
def wheelhouse_verify(c):
    """Check every wheel, manifest, index page, hash and file mode of wheelhouse/ (exit 11 on any drift)."""
    _kforge(c, "wheelhouse", "verify")


@task(help={"dirs": "comma-separated wheelhouse folders to merge into wheelhouse/", "replace": "let them win conflicts"})
def wheelhouse_merge(c, dirs, replace=False):
    """Merge per-job wheelhouses into wheelhouse/ (atomic; refuses a file name with two sha256s)."""
    _kforge(c, "wheelhouse", "merge", *dirs.split(","), *(["--replace"] if replace else []))


@task(help={"project": "only this project's wheels"})
def wheelhouse_clean(c, project=None):
    """Remove wheels (and their manifests) from wheelhouse/, then rebuild the index."""
    _kforge(c, "wheelhouse", "clean", *([project] if project else []))


@task(help={"check": "only check that the checked-in workflows match forge.toml"})
def ci_generate(c, check=False):
    """Generate .github/workflows/ from forge.toml's matrix."""
    _kforge(c, "ci", "generate", *(["--check"] if check else []))


@task(iterable=["only"], help={"project": "a project with a release matrix in forge.toml",
                                "dry_run": "print the matrix and cost only",
                                "only": "only this part: ARCH, VARIANT-ID or ARCH/VARIANT-ID (repeatable)",
                                "gpu_tests": "run each wheel's GPU tests and record them in the release manifest"})
def release_cut(c, project, dry_run=False, only=None, gpu_tests=False):
    """Build a project's release matrix into one wheelhouse (kforge release; skips what is published)."""
    _kforge(c, "release", project, *(["--dry-run"] if dry_run else []), *[w for o in only or () for w in ("--only", o)],
            *(["--gpu-tests"] if gpu_tests else []))


def _ns(name, **tasks):
    col = Collection(name)
    for short, t in tasks.items():
        col.add_task(t, name=short)
    return col


ns = Collection(
    _ns("externals", status=externals_status, sync=externals_sync, verify=externals_verify, kit=externals_kit),
    _ns("patches", status=patches_status, apply=patches_apply, refresh=patches_refresh),
    _ns("wheelhouse", index=wheelhouse_index, verify=wheelhouse_verify, merge=wheelhouse_merge, clean=wheelhouse_clean),
    _ns("ci", generate=ci_generate),
    _ns("release", cut=release_cut),
)
