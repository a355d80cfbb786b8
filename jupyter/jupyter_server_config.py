"""The course's JupyterLab settings: `make lab` and the browser test put this folder on
JUPYTER_CONFIG_PATH, so they add to (never replace) a learner's own Jupyter configuration."""

import os
from pathlib import Path

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
