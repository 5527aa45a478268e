# A site folder carried to the device machine in parts (64 MiB a call), for vllm_bundle.sh and fa4_bundle.sh:
#   parts_split SITE NAME [XZ_LEVEL]   here: SITE packed as .NAME/p00, p01, ... (xz, 40 MiB each; git-ignored)
#   parts_stash NAME                   there, in each call that carries parts: keep them in /tmp/NAME-parts
#   parts_unpack NAME                  there, the last call: /tmp/NAME-site from the parts, once; returns 1 when
#                                      it was already unpacked
parts_split() {
  grep -qx "/.$2/" .git/info/exclude 2>/dev/null || echo "/.$2/" >> .git/info/exclude
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
  cat "/tmp/$1-parts"/p[0-9]* | xz -d | tar xf - -C "/tmp/$1-site" && touch "/tmp/$1-site/.done"
}
