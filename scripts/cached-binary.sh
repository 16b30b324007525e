# Sourced by install-kube.sh and install-k8s-plugin.sh: a binary built once per version, cached OUTSIDE the
# clone, and linked into .tools/bin (a fresh clone, or CI on the same machine, reuses it).
#
# install_cached NAME OBTAIN [SUFFIX...]
#   NAME    the binary's file name in .tools/bin and in the cache folder
#   OBTAIN  a function `OBTAIN OUT INFO` that makes the binary at OUT and records how in INFO
#   SUFFIX  sibling files that travel with the binary (e.g. .version for NAME.version)
# Uses the caller's globals root, bin, cache (from cache_dir), version and its functions say and is_wanted BINARY.

# PROXY_OPERATOR_NO_BUILD_CACHE=1: neither read nor write the cache (the binary goes into .tools/bin).
no_cache="${PROXY_OPERATOR_NO_BUILD_CACHE:-}"

cache_dir() {  # cache_dir KEY: the folder for one binary and version, shared by every clone
  local base="${PROXY_OPERATOR_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:?is not set: set PROXY_OPERATOR_CACHE_DIR}/.cache}/proxy-operator}"
  printf '%s/%s\n' "$base" "$1"
}

install_cached() {
  local name="$1" obtain="$2"
  shift 2
  local suffixes=("$@") target info suffix
  target="$bin/$name"
  info="$root/.tools/$name-build-info.txt"
  mkdir -p "$bin"
  if [ -n "$no_cache" ]; then
    if [ ! -L "$target" ] && is_wanted "$target"; then
      say "$name $version is in place ($target, made without the cache); nothing to do"
      return 0
    fi
    say "PROXY_OPERATOR_NO_BUILD_CACHE is set: installing into $bin, not reading or writing $cache"
    rm -f "$target"  # may be a link into the cache
    for suffix in "${suffixes[@]}"; do rm -f "$target$suffix"; done
    "$obtain" "$target" "$info"
    return 0
  fi
  if [ -L "$target" ] && [ "$(readlink "$target")" = "$cache/$name" ] && is_wanted "$target"; then
    say "$name $version is in place ($target -> $cache); nothing to do"
    return 0
  fi
  mkdir -p "$cache"
  exec 9>"$cache/.lock"
  flock 9  # another clone building the same version: wait for it and reuse its binary
  if is_wanted "$cache/$name"; then
    say "reusing the cached $name $version ($cache)"
  elif [ ! -L "$target" ] && is_wanted "$target"; then
    cp "$target" "$cache/$name.tmp" && mv -f "$cache/$name.tmp" "$cache/$name"
    for suffix in "${suffixes[@]}"; do cp "$target$suffix" "$cache/$name$suffix"; done
    cp "$info" "$cache/build-info.txt" 2>/dev/null || true
    say "cached the $name $version that $bin held (made without the cache) in $cache"
  else
    "$obtain" "$cache/$name" "$cache/build-info.txt"
  fi
  exec 9>&-
  ln -sfn "$cache/$name" "$target"
  for suffix in "${suffixes[@]}"; do ln -sfn "$cache/$name$suffix" "$target$suffix"; done
  say "linked $target -> $cache/$name"
}
