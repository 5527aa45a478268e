# A site folder carried to the device machine in parts (64 MiB a call), for vllm_bundle.sh and fa4_bundle.sh:
#   parts_split SITE NAME [XZ_LEVEL]   here: SITE packed as .NAME/p00, p01, ... (xz, 40 MiB each; git-ignored)
#   parts_stash NAME                   there, in each call that carries parts: keep them in /tmp/NAME-parts
#   parts_unpack NAME                  there, the last call: /tmp/NAME-site from the parts. Returns 0 when it
#                                      unpacked them (the caller finishes the site, then runs `parts_done NAME`),
#                                      1 when the site was finished before, 2 when the parts did not unpack
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

parts_unpack() {
  [ -f "/tmp/$1-site/.done" ] && return 1
  rm -rf "/tmp/$1-site" && mkdir -p "/tmp/$1-site"
  if ! cat "/tmp/$1-parts"/p[0-9]* | xz -d | tar xf - -C "/tmp/$1-site"; then
    echo "bundle_parts: the parts of $1 in /tmp/$1-parts did not unpack (is every part stashed?)" >&2
    return 2
  fi
}

parts_done() {
  touch "/tmp/$1-site/.done"
}
