# JupyterLab's terminals under `make lab` start bash with this file (jupyter/jupyter_server_config.py):
# the learner's own ~/.bashrc first, then the course's Python first on PATH, as the server has it
# (a ~/.bashrc that sets up pyenv or conda puts its own python in front).
if [ -f "$HOME/.bashrc" ]; then . "$HOME/.bashrc"; fi
if [ -n "$VIRTUAL_ENV" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then
    PATH="$VIRTUAL_ENV/bin:$PATH"
fi
