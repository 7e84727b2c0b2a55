#!/usr/bin/env bash
# Make sure the PostgreSQL server the tests use is reachable (the store is tested on SQLite and
# PostgreSQL). Called by `make test` (and so by CI).
#
#   RADCALIPER_TEST_POSTGRES_URL   the server and database the tests use
#                                  (default postgresql://postgres@127.0.0.1:5432/test)
#
# With the default URL: if nothing answers on 127.0.0.1:5432, start the local cluster if
# PostgreSQL is installed, else install it from Debian's packages (needs root), allow trust
# authentication from 127.0.0.1 (a test server; do not do this on a production server) and create
# the database `test`. With another URL, only check that it answers. Fails loudly otherwise.
set -euo pipefail

url=${RADCALIPER_TEST_POSTGRES_URL:-postgresql://postgres@127.0.0.1:5432/test}
hostport=${url#*@}; hostport=${hostport%%/*}
host=${hostport%%:*}; port=${hostport##*:}; [ "$port" = "$hostport" ] && port=5432

ready() { command -v pg_isready >/dev/null 2>&1 && pg_isready -q -h "$host" -p "$port"; }

if ready; then exit 0; fi
if [ -n "${RADCALIPER_TEST_POSTGRES_URL:-}" ]; then
  echo "ensure_postgres: $host:$port does not answer (RADCALIPER_TEST_POSTGRES_URL); start it" >&2
  exit 1
fi

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
if ! command -v pg_ctlcluster >/dev/null 2>&1; then
  echo "ensure_postgres: installing PostgreSQL from Debian's packages" >&2
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi
version=$(ls /etc/postgresql | sort -V | tail -n 1)
hba=/etc/postgresql/$version/main/pg_hba.conf
if ! $sudo grep -qE '^host\s+all\s+all\s+127\.0\.0\.1/32\s+trust' "$hba"; then
  echo "ensure_postgres: allowing trust authentication from 127.0.0.1 in $hba (test server)" >&2
  $sudo sed -i '1i host all all 127.0.0.1/32 trust\nlocal all all trust' "$hba"
fi
echo "ensure_postgres: starting PostgreSQL $version" >&2
$sudo pg_ctlcluster --skip-systemctl-redirect "$version" main start || \
  $sudo pg_ctlcluster --skip-systemctl-redirect "$version" main reload
for _ in $(seq 1 30); do ready && break; sleep 1; done
if ! ready; then
  echo "ensure_postgres: PostgreSQL did not come up on $host:$port" >&2
  exit 1
fi
if ! psql -h "$host" -p "$port" -U postgres -d test -c 'select 1' >/dev/null 2>&1; then
  psql -h "$host" -p "$port" -U postgres -d postgres -c 'CREATE DATABASE test' >/dev/null
fi
