# A site folder carried to the device machine in parts (64 MiB a call), for vllm_bundle.sh and fa4_bundle.sh:
#   parts_split SITE NAME [XZ_LEVEL]   here: SITE packed as .NAME/p00, p01, ... (xz, 40 MiB each; git-ignored)
#   parts_stash NAME                   there, in each call that carries parts: keep them in /tmp/NAME-parts
#   parts_install NAME [FINISH ...]    there, the last call: /tmp/NAME-site from the parts, once; a fresh unpack
#                                      runs FINISH (the caller's last touches) before it counts as done. Returns
#                                      2 when the parts did not unpack
parts_split() {
  local exclude
  exclude=$(git rev-parse --git-path info/exclude)
  grep -qxF "/.$2/" "$exclude" 2>/dev/null || echo "/.$2/" >> "$exclude"
  rm -f ".$2"/p[0-9]* && mkdir -p ".$2"
  tar cf - -C "$1" . | xz "-${3:-9}" -T0 | split -b 40M -d -a 2 - ".$2/p"
  ls -la ".$2"
}

parts_stash() {
  mkdir -p "/tmp/$1-parts" && cp ".$1"/p[0-9]* "/tmp/$1-parts/" && ls -la "/tmp/$1-parts"
}

parts_install() {
  local name=$1
  shift
  [ -f "/tmp/$name-site/.done" ] && return 0
  rm -rf "/tmp/$name-site" && mkdir -p "/tmp/$name-site"
  if ! cat "/tmp/$name-parts"/p[0-9]* | xz -d | tar xf - -C "/tmp/$name-site"; then
    echo "bundle_parts: the parts of $name in /tmp/$name-parts did not unpack (is every part stashed?)" >&2
    return 2
  fi
  "$@" && touch "/tmp/$name-site/.done"
}
