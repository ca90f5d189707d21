# Sourced by main.sh and reproduce.sh: `place SOURCE DEST` moves a new file into place without
# losing the one it replaces. A file committed in git and unmodified is replaced (git restores
# it; its name is added to the array `replaced`); any other existing file is renamed to
# DEST.previous first (replacing the one an earlier run kept there: this script made that one), and
# that is said on stderr.
replaced=()
place() {
  local src="$1" dest="$2"
  mkdir -p "$(dirname "$dest")"
  if [ -e "$dest" ]; then
    if git ls-files --error-unmatch "$dest" >/dev/null 2>&1 && git diff --quiet -- "$dest" 2>/dev/null; then
      replaced+=("$dest")
    else
      local aside
      aside="$dest.previous"
      mv "$dest" "$aside"
      echo "kept the earlier $dest as $aside" >&2
    fi
  fi
  mv "$src" "$dest"
}
