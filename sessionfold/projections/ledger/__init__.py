"""The rule ledger: Longhaul's compaction pass as a projection (seeds/002).

Modules: `fold` (events into the Store), `state` (keys, head, snapshot), `commands` (bash calls
and exit codes), `text` (message text, sanitizer), `heuristics` (reading standing rules and
withdrawals), `rules` (the lift check), `answer` (the model answer's schema), `verify` (code's
checks of an answer), `model` (the DiffModel port and the offline model), `prompt`, `pass_`
(one pass), `render` (the summary), `driver` (the embedded synchronous loop), `facts`.
"""
