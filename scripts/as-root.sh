# Sourced by scripts/test-all and lab/lab.sh, so that set-up works the same as root and as a
# user with sudo: `as_root CMD...` runs CMD directly when root, otherwise through sudo.
#
# A password is asked for (when one is needed and there is a terminal) before CMD runs, because
# the callers wrap CMD in `timeout`, under which a prompt could not read the terminal; sudo's
# own passwd_timeout bounds that prompt. Without a terminal only passwordless sudo can work, and
# that is checked with `sudo -n` rather than left to hang.
as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
    return
  fi
  if ! command -v sudo >/dev/null 2>&1; then
    echo "as_root: '$*' needs root: run as root, or install sudo" >&2
    return 1
  fi
  if [ -t 0 ]; then
    sudo -v || return 1
  elif ! sudo -n true 2>/dev/null; then
    echo "as_root: '$*' needs root: sudo asks for a password and there is no terminal" \
      "(run as root, or allow this user passwordless sudo)" >&2
    return 1
  fi
  sudo -n "$@"
}
