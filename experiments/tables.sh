# Sourced by experiments/*.sh after lib.sh: tables made by
# experiments/cli_tables.py from what a CLI wrote, recorded together.
#   tabulate MODE ID INPUT... [OPTIONS]  cli_tables.py MODE --out=$out/ID.json
#                                        INPUT... OPTIONS; keeps the table and
#                                        the figures its --figure options name
#   record_tables [ARGS...]              record (lib.sh) every kept table and
#                                        figure, and ARGS
tabulated=()

tabulate() {
  local mode=$1 id=$2 line
  shift 2
  .venv/bin/python experiments/cli_tables.py "$mode" --out="$out/$id.json" \
    "$@" > "$out/$id.figures"
  tabulated+=(--table="$id=$out/$id.json")
  while IFS= read -r line; do
    tabulated+=(--figure="$line")
  done < "$out/$id.figures"
}

record_tables() {
  record "${tabulated[@]}" "$@"
}
