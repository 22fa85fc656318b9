#!/usr/bin/env bash
# `dedupwire backup` beside restic 0.19.1 and borg 1.4.5, in one run, on three kinds of data;
# called by `bench/run.sh backup` (which builds the release binary first). Tables on stdout,
# raw figures in target/bench/backup-<date>.json (bench/backup_report.py).
#
#   releases  consecutive PyPI sdists of two packages (Django 4.2.1..4.2.6 from
#             bench/fetch-data.sh, SQLAlchemy 2.0.20..2.0.25), each unpacked in turn to the SAME
#             path ($WORK/tree/src, the previous release deleted first) and backed up
#   dumps     a throwaway PostgreSQL 15 with a table of documents (every line of the shared
#             *.jsonl.zst revision streams is a row; a generator when they are absent),
#             pg_dump'ed to the same file ($WORK/dumps/db.sql) and backed up; then 1% of the
#             rows (random, seeded) get a small edit, VACUUM, dump again: NIGHTS dumps (10)
#   tree      a copy of /usr (less /usr/local and the Google Cloud SDK: 3.5 GB, 70k files here):
#             a first backup, one with nothing changed, one after touching 1% of the files
#   then each tool restores the last snapshot of `dumps` and of `tree` to a fresh directory,
#   checked with `diff -r` against the source.
#
# Per backup: bytes added to the repository (`du -sb` before/after), wall, user+sys CPU, peak
# RSS (/usr/bin/time); per restore: wall and peak RSS. The similarity reference ("oracle") is
# `zstd --patch-from` of each version against the one before (a tar of the tree for releases,
# the dump itself for dumps). Tools run in turn on each version, so a noisy neighbour hits all.
# Real KDF defaults (DEDUPWIRE_TEST_KDF is unset); restic's default compression (auto); borg
# `init --encryption=repokey`, `create --compression zstd,3`.
#
# Knobs (environment): PARTS="releases dumps tree"  TOOLS="dedupwire restic borg"  NIGHTS=10
#   WORK=/tmp/bench (scratch, wiped)  BIG_SRC=/usr  BIG_EXCLUDE="usr/local usr/lib/google-cloud-sdk"
#   ORACLE_LEVEL=19 (releases) ORACLE_DUMP_LEVEL=19 (dumps)  SQLA_VERSIONS="2.0.20 … 2.0.25"
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
started=$(date +%s)
read -r -a PARTS <<<"${PARTS:-releases dumps tree}"
read -r -a TOOLS <<<"${TOOLS:-dedupwire restic borg}"
NIGHTS=${NIGHTS:-10}
W=${WORK:-/tmp/bench}
DATA=${DATA:-$root/target/bench-data}
SHARED=${SHARED:-$root/../shared}
BIG_SRC=${BIG_SRC:-/usr}
BIG_EXCLUDE=${BIG_EXCLUDE:-usr/local usr/lib/google-cloud-sdk}
ORACLE_LEVEL=${ORACLE_LEVEL:-19}
ORACLE_DUMP_LEVEL=${ORACLE_DUMP_LEVEL:-19}
DJANGO_VERSIONS=${DJANGO_VERSIONS:-"4.2.1 4.2.2 4.2.3 4.2.4 4.2.5 4.2.6"}
SQLA_VERSIONS=${SQLA_VERSIONS:-"2.0.20 2.0.21 2.0.22 2.0.23 2.0.24 2.0.25"}
die() { echo "bench backup: $*" >&2; exit 1; }

# --- the tools ----------------------------------------------------------------------------
dw=$root/target/release/dedupwire
[ -x "$dw" ] || die "no $dw: cargo build --release -p dedupwire-cli (bench/run.sh does)"
restic=$(bash bench/restic.sh) || die "could not build restic (bench/restic.sh)"
borg=$(bash bench/borg.sh) || die "could not install borg (bench/borg.sh)"
for p in zstd /usr/bin/time pg_dump psql; do command -v "$p" >/dev/null || die "$p is missing"; done
versions_json=$(python3 -c 'import json,sys; print(json.dumps(dict(zip(sys.argv[1::2], sys.argv[2::2]))))' \
  dedupwire "$("$dw" --version 2>&1 | head -1), built from $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates Cargo.toml Cargo.lock || echo ' plus uncommitted changes'), binary sha256 $(sha256sum "$dw" | cut -c1-16)" restic "$("$restic" version | head -1)" \
  borg "$("$borg" --version)" zstd "$(zstd --version)" postgres "$(pg_dump --version)")

# One run at a time on a scratch directory (a second would wipe the first's).
exec 9>"$W.lock"
flock -n 9 || die "another run is using $W (lock $W.lock)"
rm -rf "$W" && mkdir -p "$W"/{repos,oracle,restore,cache,log,bin} || die "cannot make $W"
chmod 755 "$W"
# A copy of the binary: others may rebuild target/release while this runs.
cp "$dw" "$W/bin/dedupwire" && dw=$W/bin/dedupwire
rec=$W/records.jsonl
: >"$rec"
unset DEDUPWIRE_TEST_KDF
export DEDUPWIRE_PASSWORD=bench-dedupwire-password RESTIC_PASSWORD=bench-restic-password
export BORG_PASSPHRASE=bench-borg-password BORG_BASE_DIR=$W/cache/borg RESTIC_CACHE_DIR=$W/cache/restic XDG_CACHE_HOME=$W/cache/xdg
export BORG_RELOCATED_REPO_ACCESS_IS_OK=yes BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK=yes

# record KEY=VALUE ...: one JSON line in $rec (numbers stay numbers; FILE@path embeds a file).
record() {
  python3 - "$@" >>"$rec" <<'PY'
import json, sys
r = {}
for a in sys.argv[1:]:
    k, v = a.split('=', 1)
    if v.startswith('FILE@'):
        try:
            t = open(v[5:], errors='replace').read()
        except OSError:
            t = ''
        try:
            r[k] = json.loads(t)
        except ValueError:
            r[k] = t[-4000:]
        continue
    try:
        r[k] = int(v)
    except ValueError:
        try:
            r[k] = float(v)
        except ValueError:
            r[k] = v
print(json.dumps(r))
PY
}
size() { du -sb "$1" 2>/dev/null | cut -f1; }

# timed NAME CMD...: runs CMD under /usr/bin/time; sets T_WALL T_USER T_SYS T_RSS T_RC, keeps
# stdout and stderr in $W/log/NAME.{out,err}.
timed() {
  local name=$1; shift
  /usr/bin/time -o "$W/log/$name.time" -f '%e %U %S %M' "$@" >"$W/log/$name.out" 2>"$W/log/$name.err"
  T_RC=$?
  T_WALL=0 T_USER=0 T_SYS=0 T_RSS=0
  read -r T_WALL T_USER T_SYS T_RSS < <(grep -E '^[0-9.]+ [0-9.]+ [0-9.]+ [0-9]+$' "$W/log/$name.time" 2>/dev/null | tail -1)
  if [ "$T_RC" != 0 ]; then
    echo "  !! $name: exit $T_RC: $*" >&2
    tail -5 "$W/log/$name.err" | sed 's/^/  !!   /' >&2
  fi
}

init_repo() { # init_repo DATASET TOOL
  local repo=$W/repos/$1/$2
  mkdir -p "$W/repos/$1"
  case $2 in
    dedupwire) timed "$1-$2-init" "$dw" repo init --repo "$repo" ;;
    restic) timed "$1-$2-init" "$restic" --repo "$repo" init ;;
    borg) timed "$1-$2-init" "$borg" init --encryption=repokey "$repo" ;;
  esac
  [ "$T_RC" = 0 ] || die "$2 could not make a repository in $repo (see $W/log/$1-$2-init.err)"
}

# backup_one DATASET TOOL INDEX LABEL RUN PATH: one snapshot of PATH.
backup_one() {
  local ds=$1 tool=$2 i=$3 label=$4 run=$5 path=$6 repo=$W/repos/$1/$2 name=$1-$2-$3
  local before after cmd
  before=$(size "$repo")
  case $tool in
    dedupwire) cmd=("$dw" backup --repo "$repo" --json --tag "$label" "$path") ;;
    restic) cmd=("$restic" --repo "$repo" backup --json --tag "$label" "$path") ;;
    borg) cmd=("$borg" create --compression zstd,3 --stats --json "$repo::$ds-$i" "$path") ;;
  esac
  timed "$name" "${cmd[@]}"
  after=$(size "$repo")
  local extra=()
  # dedupwire's own summary (one JSON object); restic's is the last line of its JSON stream.
  case $tool in
    dedupwire) extra=("tool_summary=FILE@$W/log/$name.out") ;;
    restic) grep '"message_type":"summary"' "$W/log/$name.out" | tail -1 >"$W/log/$name.sum" && extra=("tool_summary=FILE@$W/log/$name.sum") ;;
    borg) extra=("tool_summary=FILE@$W/log/$name.out") ;;
  esac
  record kind=backup dataset="$ds" tool="$tool" index="$i" label="$label" run="$run" \
    added=$((after - before)) repo_bytes="$after" wall="$T_WALL" user="$T_USER" sys="$T_SYS" \
    rss_kb="$T_RSS" rc="$T_RC" command="${cmd[*]}" "stderr=FILE@$W/log/$name.err" "${extra[@]}"
  printf '  %-9s %-14s %-10s +%12d B  %7.2f s wall  %7.2f s cpu  %6d MB rss%s\n' "$ds" "$label" "$tool" \
    $((after - before)) "$T_WALL" "$(awk "BEGIN{print $T_USER + $T_SYS}")" $((T_RSS / 1024)) \
    "$([ "$T_RC" = 0 ] || echo "  EXIT $T_RC")"
}

# restore_one DATASET TOOL SOURCE LAST-INDEX: the latest snapshot to a fresh directory, diffed.
restore_one() {
  local ds=$1 tool=$2 src=$3 last=$4 repo=$W/repos/$1/$2 tgt=$W/restore/$1-$2 name=$1-$2-restore cmd
  rm -rf "$tgt" && mkdir -p "$tgt"
  case $tool in
    dedupwire) cmd=("$dw" restore latest --repo "$repo" --target "$tgt") ;;
    restic) cmd=("$restic" --repo "$repo" restore latest --target "$tgt") ;;
    # borg extracts into the working directory, the paths without their leading /.
    borg) cmd=(env -C "$tgt" "$borg" extract "$repo::$ds-$last") ;;
  esac
  timed "$name" "${cmd[@]}"
  local rrc=$T_RC rwall=$T_WALL ruser=$T_USER rsys=$T_SYS rrss=$T_RSS verified=no files
  files=$(find "$tgt" -type f | wc -l)
  if diff -r --no-dereference "$src" "$tgt$src" >"$W/log/$name.diff" 2>&1; then verified=yes; fi
  record kind=restore dataset="$ds" tool="$tool" label=restore run=restore wall="$rwall" \
    user="$ruser" sys="$rsys" rss_kb="$rrss" rc="$rrc" verified="$verified" files="$files" \
    bytes="$(size "$src")" command="${cmd[*]}" "stderr=FILE@$W/log/$name.err" "diff=FILE@$W/log/$name.diff"
  printf '  %-9s %-14s %-10s restore  %7.2f s wall  %6d MB rss  diff -r: %s%s\n' "$ds" "latest" "$tool" \
    "$rwall" $((rrss / 1024)) "$([ $verified = yes ] && echo identical || echo "DIFFERENT ($(wc -l <"$W/log/$name.diff") lines)")" \
    "$([ "$rrc" = 0 ] || echo "  EXIT $rrc")"
  rm -rf "$tgt"
}

# oracle DATASET INDEX LABEL PREV CUR LEVEL: zstd -LEVEL of CUR against PREV (--patch-from), the
# long-distance window covering both files; the first version (PREV empty) alone at -3, only
# for reference (slow levels on whole files would take minutes and are no similarity figure).
oracle() {
  local ds=$1 i=$2 label=$3 prev=$4 cur=$5 level=$6 out=$W/oracle/$1-$2.zst n=27 max t0 t1 how
  max=$(stat -c %s "$cur"); [ -n "$prev" ] && [ "$(stat -c %s "$prev")" -gt "$max" ] && max=$(stat -c %s "$prev")
  while [ $((1 << n)) -lt "$max" ] && [ $n -lt 31 ]; do n=$((n + 1)); done
  t0=$(date +%s.%N)
  if [ -n "$prev" ]; then
    how="zstd -$level --long=$n --patch-from=previous"
    zstd -q -f "-$level" --long=$n --patch-from="$prev" "$cur" -o "$out" 2>"$W/log/oracle.err"
  else
    how="zstd -3 --long=$n -T0 (no previous version)"
    zstd -q -f -3 --long=$n -T0 "$cur" -o "$out" 2>"$W/log/oracle.err"
  fi
  t1=$(date +%s.%N)
  rec=$W/oracle.jsonl record kind=oracle dataset="$ds" index="$i" label="$label" added="$(stat -c %s "$out")" \
    input="$(stat -c %s "$cur")" seconds="$(awk "BEGIN{print $t1 - $t0}")" method="$how"
  printf '  %-9s %-14s %-10s +%12d B  (of %d B, %.1f s: %s)\n' "$ds" "$label" oracle "$(stat -c %s "$out")" \
    "$(stat -c %s "$cur")" "$(awk "BEGIN{print $t1 - $t0}")" "$how"
  rm -f "$out"
}
# The oracle runs beside the timed work, in one background worker at the lowest CPU and I/O
# priority (zstd -19 --patch-from takes 1-2 min per version on this machine: run in line, it
# would double the benchmark's time), then at normal priority once the timed work is done.
# oracle_job queues a version (the files are the worker's until it is done with them); the
# worker takes the jobs in order.
oq=$W/oracle/queue
oracle_job() { # oracle_job DATASET INDEX LABEL PREV CUR LEVEL
  local n; n=$(($(ls "$oq" | grep -c '\.job$') + 1))
  echo "$1 $2 $3 ${4:--} $5 $6" >"$oq/tmp" && mv "$oq/tmp" "$oq/$(printf %04d "$n").job"
}
oracle_worker() {
  local n=0 f ds i label prev cur level
  renice -n 19 -p $BASHPID >/dev/null 2>&1; ionice -c 3 -p $BASHPID 2>/dev/null
  while :; do
    f=$oq/$(printf %04d $((n + 1))).job
    if [ -e "$f" ]; then
      n=$((n + 1))
      read -r ds i label prev cur level <"$f"
      [ "$prev" = - ] && prev=
      oracle "$ds" "$i" "$label" "$prev" "$cur" "$level"
      [ -n "$prev" ] && rm -f "$prev"
    elif [ -e "$oq/end" ]; then
      break
    else
      sleep 2
    fi
  done
}

# --- (a) release series -------------------------------------------------------------------
fetch_sqla() {
  local v
  mkdir -p "$DATA/sdists"
  for v in $SQLA_VERSIONS; do
    ls "$DATA"/sdists/[Ss][Qq][Ll][Aa]lchemy-"$v".tar.gz >/dev/null 2>&1 && continue
    echo "bench backup: fetching SQLAlchemy $v's sdist from PyPI (~10 MB, then pip prepares it)" >&2
    pip download -q --no-deps --no-binary :all: -d "$DATA/sdists" "sqlalchemy==$v" >&2 ||
      die "pip download sqlalchemy==$v failed"
  done
}
releases() {
  bash bench/fetch-data.sh >/dev/null || die "bench/fetch-data.sh failed"
  fetch_sqla
  local pkg versions v i sdist tree=$W/tree/src prev tool
  for pkg in django sqlalchemy; do
    if [ $pkg = django ]; then versions=$DJANGO_VERSIONS; else versions=$SQLA_VERSIONS; fi
    local ds=rel-$pkg
    echo "## $ds: $(wc -w <<<"$versions") releases ($versions) unpacked in turn to $tree"
    for tool in "${TOOLS[@]}"; do init_repo "$ds" "$tool"; done
    i=0; prev=
    for v in $versions; do
      i=$((i + 1))
      sdist=$(ls "$DATA"/sdists/*.tar.gz | grep -i "/$pkg-$v.tar.gz$" | head -1)
      [ -n "$sdist" ] || die "no sdist of $pkg $v in $DATA/sdists"
      rm -rf "$tree" && mkdir -p "$tree" && tar -xzf "$sdist" -C "$tree" --strip-components=1 ||
        die "cannot unpack $sdist"
      local tar=$W/oracle/$ds-$i.tar
      tar -C "$tree" --sort=name --owner=0 --group=0 --numeric-owner -cf "$tar" .
      record kind=input dataset="$ds" index="$i" label="$pkg-$v" bytes="$(size "$tree")" \
        files="$(find "$tree" -type f | wc -l)" tar_bytes="$(stat -c %s "$tar")"
      oracle_job "$ds" "$i" "$pkg-$v" "$prev" "$tar" "$ORACLE_LEVEL"
      for tool in "${TOOLS[@]}"; do backup_one "$ds" "$tool" "$i" "$pkg-$v" "v$i" "$tree"; done
      prev=$tar
    done
  done
}

# --- (b) nightly dumps --------------------------------------------------------------------
pg_bindir() {
  local d
  for d in ${PG_BINDIR:-} /usr/lib/postgresql/15/bin /usr/lib/postgresql/*/bin; do
    [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && { echo "$d"; return; }
  done
  die "no PostgreSQL server (apt-get install -y postgresql-15)"
}
PG_DIR= PG_PORT= PG_BIN=
pg_as() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
pg_stop() { [ -n "$PG_DIR" ] && pg_as "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m immediate -w stop >/dev/null 2>&1; PG_DIR=; }
trap 'pg_stop; [ -n "${worker:-}" ] && kill "$worker" 2>/dev/null' EXIT
pg_start() {
  PG_BIN=$(pg_bindir)
  PG_DIR=$W/pg
  mkdir -p "$PG_DIR"
  [ "$(id -u)" = 0 ] && chown postgres: "$PG_DIR"
  pg_as env LC_ALL=C "$PG_BIN/initdb" -D "$PG_DIR/data" -A trust -U postgres -E UTF8 --locale=C \
    --no-sync >"$W/log/initdb.log" 2>&1 || die "initdb failed (see $W/log/initdb.log)"
  PG_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  pg_as "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/server.log" -w -t 60 \
    -o "-p $PG_PORT -k $PG_DIR -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off -c autovacuum=off" \
    start >/dev/null || die "pg_ctl start failed (see $PG_DIR/server.log)"
}
psql_() { psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U postgres -d bench "$@"; }
dumps() {
  local dumpdir=$W/dumps dump=$W/dumps/db.sql prev= n tool
  echo "## dumps: $NIGHTS nightly pg_dumps to $dump, 1% of the rows edited between two"
  pg_start
  psql -X -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -c 'CREATE DATABASE bench' || die "createdb failed"
  psql_ -c 'CREATE TABLE docs (id int PRIMARY KEY, path text, op text, author text, ts timestamptz,
              version int NOT NULL DEFAULT 1, body text)'
  local srcs=("$SHARED"/data/*.jsonl.zst) source
  if [ -e "${srcs[0]}" ]; then
    source="every line of ${srcs[*]##*/} as a row"
    # A JSON line per document, in COPY's text format (tab-separated, backslash escapes).
    zstdcat "${srcs[@]}" | python3 -c '
import json, sys
def esc(v):
    if v is None: return r"\N"
    return str(v).replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
for i, line in enumerate(sys.stdin, 1):
    d = json.loads(line)
    ts = d.get("ts")
    row = [i, d.get("_id"), d.get("op"), d.get("author"), ts, 1, d.get("body")]
    print("\t".join(esc(v) for v in row))
' >"$W/docs.tsv" || die "cannot read ${srcs[*]}"
    psql_ -c 'CREATE TEMP TABLE raw (id int, path text, op text, author text, ts bigint, version int, body text)' \
      -c "\\copy raw FROM '$W/docs.tsv'" \
      -c 'INSERT INTO docs SELECT id, path, op, author, to_timestamp(ts), version, body FROM raw ORDER BY id' ||
      die "loading the documents failed"
    rm -f "$W/docs.tsv"
  else
    source="generated: 200000 user/order records"
    psql_ -o /dev/null -c "SELECT setseed(0.5)" -c "INSERT INTO docs
      SELECT g, 'orders/' || (g % 5000) || '/' || g, 'insert', 'user' || (g % 5000),
        timestamptz '2025-01-01' + g * interval '17 seconds', 1,
        json_build_object('order', g, 'customer', 'user' || (g % 5000), 'email', md5(g::text) || '@example.com',
          'items', (SELECT json_agg(json_build_object('sku', 'SKU-' || (g * k * 7919 % 90000 + 10000),
                     'qty', 1 + (g + k) % 4, 'price', round((random() * 200)::numeric, 2)))
                    FROM generate_series(1, 1 + g % 5) k),
          'address', (g * 7919 % 9999) || ' ' || (ARRAY['Oak','Elm','Pine','Main','High'])[1 + g % 5] || ' St',
          'status', (ARRAY['new','paid','shipped','delivered'])[1 + g % 4])::text
      FROM generate_series(1, 200000) g" || die "generating the table failed"
  fi
  psql_ -c 'VACUUM ANALYZE docs'
  local rows; rows=$(psql_ -At -c 'SELECT count(*) FROM docs')
  echo "  table docs: $rows rows ($source)"
  mkdir -p "$dumpdir"
  for tool in "${TOOLS[@]}"; do init_repo dumps "$tool"; done
  for n in $(seq "$NIGHTS"); do
    if [ "$n" -gt 1 ]; then
      # A night's edits: 1% of the rows, drawn at random (seeded), each gets a short insertion at a
      # random place in its body, a new version and timestamp; then the nightly VACUUM.
      psql_ -o /dev/null -c "SELECT setseed(0.$((1000 + n)))" -c "UPDATE docs SET version = version + 1,
          ts = ts + interval '1 day',
          body = overlay(body placing ' [edited on night $n]' from 1 + floor(random() * length(body))::int for 0)
        WHERE id IN (SELECT id FROM docs ORDER BY random() LIMIT (SELECT greatest(1, count(*) / 100) FROM docs))" \
        -c 'VACUUM docs' || die "the night's update failed"
    fi
    pg_dump -h 127.0.0.1 -p "$PG_PORT" -U postgres -d bench -f "$dump" || die "pg_dump failed"
    record kind=input dataset=dumps index="$n" label="night-$n" bytes="$(stat -c %s "$dump")" rows="$rows" source="$source"
    cp "$dump" "$W/oracle/dumps-$n.sql"
    oracle_job dumps "$n" "night-$n" "$prev" "$W/oracle/dumps-$n.sql" "$ORACLE_DUMP_LEVEL"
    for tool in "${TOOLS[@]}"; do backup_one dumps "$tool" "$n" "night-$n" "v$n" "$dumpdir"; done
    prev=$W/oracle/dumps-$n.sql
  done
  pg_stop
  for tool in "${TOOLS[@]}"; do restore_one dumps "$tool" "$dumpdir" "$NIGHTS"; done
}

# --- (c) a large tree: speed ---------------------------------------------------------------
tree() {
  local big=$W/big tool ex=() e
  for e in $BIG_EXCLUDE; do ex+=("--exclude=$e"); done
  echo "## tree: a copy of $BIG_SRC (less ${BIG_EXCLUDE:-nothing}) in $big"
  mkdir -p "$big"
  tar -C / "${ex[@]}" -cf - "${BIG_SRC#/}" 2>"$W/log/tree-copy.err" | tar -C "$big" -xf - ||
    echo "  (the copy had errors: $W/log/tree-copy.err)" >&2
  local bytes files; bytes=$(size "$big"); files=$(find "$big" -type f | wc -l)
  echo "  $((bytes / 1000000)) MB in $files files"
  record kind=input dataset=tree index=1 label=tree bytes="$bytes" files="$files" source="$BIG_SRC"
  for tool in "${TOOLS[@]}"; do init_repo tree "$tool"; done
  # The tree was just written, so it is in the page cache for every tool alike; read it once more
  # all the same.
  tar -C "$big" -cf - . | cat >/dev/null
  for tool in "${TOOLS[@]}"; do backup_one tree "$tool" 1 first first "$big"; done
  for tool in "${TOOLS[@]}"; do backup_one tree "$tool" 2 unchanged incr-unchanged "$big"; done
  # 1% of the files (every 100th, sorted by path) get a new mtime; contents unchanged.
  find "$big" -type f | sort | awk 'NR % 100 == 0' | tr '\n' '\0' | xargs -0 touch
  for tool in "${TOOLS[@]}"; do backup_one tree "$tool" 3 touched-1% incr-touched "$big"; done
  for tool in "${TOOLS[@]}"; do restore_one tree "$tool" "$big" 3; done
}

mkdir -p "$oq"
oracle_worker &
worker=$!
load() { record kind=load at="$1" loadavg="$(cut -d' ' -f1-3 /proc/loadavg)" time="$(date -u +%FT%TZ)"; }
load start
for p in "${PARTS[@]}"; do
  case $p in
    releases) releases ;;
    dumps) dumps ;;
    tree) tree ;;
    *) die "unknown part $p (releases, dumps, tree)" ;;
  esac
  # dedupwire's own view of each repository it wrote: check (structure) and stats.
  for ds in $(ls "$W/repos" 2>/dev/null); do
    [ -d "$W/repos/$ds/dedupwire" ] && [ ! -e "$W/log/$ds-dw-stats.json" ] || continue
    "$dw" repo stats --repo "$W/repos/$ds/dedupwire" --json >"$W/log/$ds-dw-stats.json" 2>"$W/log/$ds-dw-stats.err"
    "$dw" repo check --repo "$W/repos/$ds/dedupwire" --json >"$W/log/$ds-dw-check.json" 2>"$W/log/$ds-dw-check.err"
    record kind=dw_repo dataset="$ds" check_rc=$? "stats=FILE@$W/log/$ds-dw-stats.json" "check=FILE@$W/log/$ds-dw-check.json" \
      "check_stderr=FILE@$W/log/$ds-dw-check.err"
  done
done

load end-of-timed-work
touch "$oq/end"
echo "## waiting for the oracle (zstd --patch-from, in the background; back at normal priority)"
# Nothing is timed any more: the worker and its zstd go back to the normal priority.
renice -n 0 -p "$worker" $(pgrep -P "$worker") >/dev/null 2>&1
ionice -c 2 -n 4 -p "$worker" $(pgrep -P "$worker") 2>/dev/null
wait "$worker"
cat "$W/oracle.jsonl" >>"$rec" 2>/dev/null
rm -rf "$W/oracle"
mkdir -p target/bench
out=target/bench/backup-$(date -u +%Y%m%d-%H%M%S).json
python3 bench/backup_report.py "$rec" "$out" \
  --command "${BENCH_CMD:-bash bench/backup.sh}" --seconds $(($(date +%s) - started)) \
  --versions "$versions_json" --nproc "$(nproc)" --env "PARTS=${PARTS[*]} TOOLS=${TOOLS[*]} NIGHTS=$NIGHTS BIG_SRC=$BIG_SRC BIG_EXCLUDE=$BIG_EXCLUDE ORACLE_LEVEL=$ORACLE_LEVEL"
