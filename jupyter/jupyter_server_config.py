"""The course's JupyterLab settings: `make lab` and the browser test put this folder on
JUPYTER_CONFIG_PATH, so they add to (never replace) a learner's own Jupyter configuration."""

import os
from pathlib import Path

from jupyter_core.paths import jupyter_config_dir

c = get_config()  # noqa: F821 (defined by Jupyter when it loads this file)

# A terminal opened in JupyterLab runs the learner's shell as a plain (not a login) shell: a
# login shell re-reads /etc/profile, which resets PATH, and `python` would no longer be the
# course's (make lab puts .venv/bin first on the server's PATH, which its terminals inherit).
# A ~/.bashrc may still put another python first: bash reads jupyter/terminal.bashrc, which runs
# the learner's ~/.bashrc and then puts $VIRTUAL_ENV/bin (set by make lab) first again.
_shell = os.environ.get("SHELL") or "/bin/sh"
_here = Path(__file__).resolve().parent
c.ServerApp.terminado_settings = {
    "shell_command": [_shell, "--rcfile", str(_here / "terminal.bashrc")]
    if Path(_shell).name == "bash"
    else [_shell]
}
# No news feed and no update check: nothing to fetch, and no question over every page.
c.LabApp.news_url = None
c.LabApp.check_for_updates_class = "jupyterlab.NeverCheckForUpdate"
# Defaults for JupyterLab's settings (overrides.json); a learner's own settings still win.
c.LabApp.app_settings_dir = str(_here / "lab-settings")
# The course's additions to JupyterLab's style (custom/custom.css: printed text scrolls sideways
# instead of wrapping inside numbers, no red mark on each control of a saved widget, an
# explorer's snapshot hidden under its live widget). JupyterLab serves custom.css from the
# server's static_custom_path, which this folder's custom/ now heads.
c.LabApp.custom_css = True
c.ServerApp.tornado_settings.update(
    {"static_custom_path": [str(_here / "custom"), str(Path(jupyter_config_dir()) / "custom")]}
)
# A learner's file browser does not list solutions/ (`make lab`): the exercises are theirs to
# solve, and the solutions one click away beside them were too tempting. The grader reads them
# from disk, not through JupyterLab. An instructor's `make lab-instructor` sets
# COURSE_SOLUTIONS=show and lists them (a learner can still type the path: hidden, not locked).
if os.environ.get("COURSE_SOLUTIONS") != "show":
    c.ContentsManager.hide_globs = [
        "__pycache__",  # jupyter_server's own defaults, then the course's folder
        "*.pyc",
        "*.pyo",
        ".DS_Store",
        "*~",
        "solutions",
    ]
