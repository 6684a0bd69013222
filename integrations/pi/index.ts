/**
 * sessionfold-pi: a pi extension that asks a local `sessionfold serve` for the context the model
 * should see on every LLM call, for compaction summaries, for recalls and for the footer line.
 *
 * It knows no pruning rule: the server renders everything. It fails open: when the server is
 * unreachable, hung, slow past the bound, or answers something unexpected, pi keeps its own
 * messages and its own compaction, the user gets one warning per outage, and no turn ever fails.
 * A server that does not answer opens a circuit breaker: sessionfold is not asked (and the recall
 * tool not offered) until a background `/health` probe answers again.
 * It speaks the live-loop HTTP contract of `sessionfold serve` (see README.md beside this file).
 *
 * Env: SESSIONFOLD_URL (default http://127.0.0.1:6068), SESSIONFOLD_API_TOKEN (Bearer),
 * SESSIONFOLD_TIMEOUT_MS (bound of one context call, default 32000; the server is asked to wait
 * a little less, so that it answers, stale if need be, before the bound),
 * SESSIONFOLD_FIRST_BYTE_MS (default 300: a call with no answer by then asks `/health` whether the
 * server is alive; one that does not answer within the probe's bound ends the call).
 */
import { existsSync } from "node:fs";
import { resolve } from "node:path";
import { request as httpRequest } from "node:http";
import { request as httpsRequest } from "node:https";
import type { ExtensionAPI, ExtensionContext } from "@earendil-works/pi-coding-agent";
import { Type } from "typebox";

/** The recall tool's name: the stubs the server renders tell the model to call it. */
export const RECALL_TOOL = "context_tree_query";
const STATUS_KEY = "sessionfold";
const STATUS_TIMEOUT_MS = 2000;
/** What a status call asks the server to wait for the leaf's fold (and its flush) at most. */
const STATUS_WAIT_MS = 1500;
const RECALL_TIMEOUT_MS = 15000;
const COMPACT_TIMEOUT_MS = 120000;
const EVENT_TIMEOUT_MS = 1000;

/** Why the extension fell back to pi's own behaviour (the contract's client-event kinds). */
export type FailKind = "unreachable" | "timeout" | "bad-answer";

export interface Config {
	url: string;
	token: string | undefined;
	/** Bound of one context call, in ms. */
	timeoutMs: number;
	/** What the server is asked to wait at most (`wait_ms`): the bound less a margin. */
	waitMs: number;
	/** A call with no answer's first byte by then asks `/health` whether the server is alive. */
	firstByteMs: number;
	/** The bound of one `/health` probe: a server that does not answer by then is taken as hung. */
	probeMs: number;
	/** While a call waits for a live server, `/health` is asked again this often. */
	probeEveryMs: number;
	/** The breaker's first back-off before it probes again, doubled per failed probe up to the cap. */
	backoffMs: number;
	backoffMaxMs: number;
}

/** The configuration from the environment. */
export function readConfig(env: NodeJS.ProcessEnv = process.env): Config {
	const positive = (value: string | undefined, fallback: number) => {
		const raw = Number(value);
		return Number.isFinite(raw) && raw > 0 ? Math.floor(raw) : fallback;
	};
	const timeoutMs = positive(env.SESSIONFOLD_TIMEOUT_MS, 32000);
	const margin = Math.min(2000, Math.floor(timeoutMs / 4));
	return {
		url: (env.SESSIONFOLD_URL || "http://127.0.0.1:6068").replace(/\/+$/, ""),
		token: env.SESSIONFOLD_API_TOKEN || undefined,
		timeoutMs,
		waitMs: timeoutMs - margin,
		firstByteMs: positive(env.SESSIONFOLD_FIRST_BYTE_MS, 300),
		probeMs: 500,
		probeEveryMs: 1000,
		backoffMs: 500,
		backoffMaxMs: 15000,
	};
}

/** `hung`: no first byte, and `/health` did not answer either (reported as a timeout). */
type Answer = { ok: true; status: number; body: unknown } | { ok: false; kind: FailKind | "hung" | "aborted" };

export interface CallOptions {
	/** The bound of the whole call: connecting, the server's wait and reading the body. */
	timeoutMs: number;
	signal?: AbortSignal;
	/** Past this with no response yet, `alive` is asked (then every `everyMs`); false ends the call. */
	firstByteMs?: number;
	everyMs?: number;
	alive?: () => Promise<boolean>;
	/** The socket does not keep node running (background probes and reports). */
	unref?: boolean;
}

/** One JSON request, bounded by its options and the caller's signal; never throws. */
export function call(cfg: Config, method: "GET" | "POST", path: string, body: unknown, options: CallOptions): Promise<Answer> {
	const { timeoutMs, signal, firstByteMs, alive, unref } = options;
	return new Promise((resolve) => {
		if (signal?.aborted) return resolve({ ok: false, kind: "aborted" });
		const url = new URL(cfg.url + path);
		const payload = body === undefined ? undefined : JSON.stringify(body);
		const headers: Record<string, string> = { accept: "application/json" };
		if (payload !== undefined) headers["content-type"] = "application/json";
		if (cfg.token) headers.authorization = `Bearer ${cfg.token}`;
		let settled = false;
		let responded = false;
		let check: NodeJS.Timeout | undefined;
		const finish = (answer: Answer) => {
			if (settled) return;
			settled = true;
			clearTimeout(timer);
			clearTimeout(check);
			signal?.removeEventListener("abort", onAbort);
			req.destroy();
			resolve(answer);
		};
		const onAbort = () => finish({ ok: false, kind: "aborted" });
		const send = url.protocol === "https:" ? httpsRequest : httpRequest;
		const req = send(url, { method, headers }, (res) => {
			responded = true;
			clearTimeout(check);
			const chunks: Buffer[] = [];
			res.on("data", (chunk: Buffer) => chunks.push(chunk));
			res.on("error", () => finish({ ok: false, kind: "unreachable" }));
			res.on("end", () => {
				const text = Buffer.concat(chunks).toString("utf8");
				let parsed: unknown;
				try {
					parsed = text === "" ? undefined : JSON.parse(text);
				} catch {
					return finish({ ok: false, kind: "bad-answer" });
				}
				finish({ ok: true, status: res.statusCode ?? 0, body: parsed });
			});
		});
		if (unref) req.on("socket", (socket) => socket.unref());
		// The bound covers connecting, the server's wait and reading the whole body.
		const timer = setTimeout(() => finish({ ok: false, kind: "timeout" }), timeoutMs);
		if (unref) timer.unref();
		// A server that has not answered by the first-byte bound may be working (waiting for its
		// fold, a model) or hung (stopped, swapped out): `/health` tells them apart in a few ms.
		const liveness = () => {
			if (settled || responded || !alive) return;
			void alive().then((ok) => {
				if (settled || responded) return;
				if (!ok) return finish({ ok: false, kind: "hung" });
				check = setTimeout(liveness, options.everyMs ?? 1000);
			});
		};
		if (firstByteMs !== undefined && alive) check = setTimeout(liveness, firstByteMs);
		signal?.addEventListener("abort", onAbort, { once: true });
		req.on("error", () => finish({ ok: false, kind: "unreachable" }));
		req.end(payload);
	});
}

function isObject(value: unknown): value is Record<string, unknown> {
	return typeof value === "object" && value !== null && !Array.isArray(value);
}

/**
 * pi's array as the context route takes it: its `shape`, each message's [role, toolCallId or
 * null], which is all the server checks it against (a few bytes per message, where the array
 * itself is megabytes in a long session); the whole array only if some message has no string
 * role or a tool call id that is not a string, so the server's check stays exact.
 */
export function arrayOf(messages: readonly unknown[]): { shape: [string, string | null][] } | { messages: readonly unknown[] } {
	const shape: [string, string | null][] = [];
	for (const message of messages) {
		const role = isObject(message) ? message.role : undefined;
		const id = isObject(message) ? (message.toolCallId ?? null) : null;
		if (typeof role !== "string" || (id !== null && typeof id !== "string")) return { messages };
		shape.push([role, id]);
	}
	return { shape };
}

/**
 * A context answer's messages when they are usable, else undefined (pi keeps its array). The
 * server sends the changed array as a patch to pi's `array` (runs `[start, end)` of pi's own
 * messages, and the messages it made, in order), or whole as `messages`.
 */
export function acceptedMessages(body: unknown, array: readonly unknown[] = []): unknown[] | undefined | "bad" {
	if (!isObject(body) || typeof body.changed !== "boolean") return "bad";
	if (!body.changed) return undefined;
	const messages = Array.isArray(body.patch) ? applyPatch(body.patch, array) : body.messages;
	if (!Array.isArray(messages) || messages.some((m) => !isObject(m) || typeof m.role !== "string")) return "bad";
	return messages;
}

/** The array a patch yields from pi's `array`, or undefined when the patch is not one. */
export function applyPatch(patch: readonly unknown[], array: readonly unknown[]): unknown[] | undefined {
	const out: unknown[] = [];
	for (const item of patch) {
		if (isObject(item)) out.push(item);
		else if (Array.isArray(item) && item.length === 2 && item.every(Number.isInteger) && 0 <= item[0] && item[0] < item[1] && item[1] <= array.length)
			out.push(...array.slice(item[0], item[1]));
		else return undefined;
	}
	return out;
}

export default function sessionfold(pi: ExtensionAPI, cfg: Config = readConfig()) {
	// Observe-only when another extension (pi-condense) owns the recall tool: two renderers of
	// one context would fight, so then sessionfold only shows its footer.
	let observeOnly = false;
	let registered = false;
	let footerBusy = false;
	let footerAgain = false;
	// The span record of the compaction this extension supplied, until pi has stored it.
	let spanRecord: Record<string, unknown> | undefined;
	// The last context a hook was handed: where a recovery found in the background is announced.
	let lastCtx: ExtensionContext | undefined;

	// The circuit breaker: open from a call the server did not answer (refused, or hung: no first
	// byte and no `/health` either) until a background `/health` probe answers. While open,
	// nothing is asked (pi runs as without sessionfold) and the recall tool is not offered.
	let open = false;
	let backoff = cfg.backoffMs;
	let probeTimer: NodeJS.Timeout | undefined;
	let outageWarned = false;
	// bad-answer warnings: once per route until that route answers well again.
	const badWarned = new Set<string>();
	// Whether the recall tool should be active when the server answers (the user's tool choice).
	let toolWanted = false;

	const sessionPath = (ctx: ExtensionContext, tail: string) =>
		`/sessions/${encodeURIComponent(ctx.sessionManager.getSessionId())}/${tail}`;

	const say = (ctx: ExtensionContext | undefined, line: string, level: "info" | "warning") => {
		try {
			if (ctx?.hasUI) return ctx.ui.notify(line, level);
		} catch {
			// a context gone stale (pi replaced the session): the terminal still shows it
		}
		console.warn(line);
	};

	/** The recall tool in pi's active set while the server answers, out of it otherwise. */
	const offerRecall = (on: boolean) => {
		if (!registered || !toolWanted) return;
		try {
			const active = pi.getActiveTools();
			const has = active.includes(RECALL_TOOL);
			if (on && !has) pi.setActiveTools([...active, RECALL_TOOL]);
			if (!on && has) pi.setActiveTools(active.filter((name) => name !== RECALL_TOOL));
		} catch {
			// pi not ready (or torn down): the next change tries again
		}
	};

	/** `/health`, bounded by the probe's bound. Unref'd unless awaited by pi itself (at
	 * session_start nothing else may keep node running meanwhile: it would exit mid-probe). */
	const probe = (unref = true) => call(cfg, "GET", "/health", undefined, { timeoutMs: cfg.probeMs, unref });
	/** Is the server alive: `/health` answers 200 within the probe's bound. */
	const alive = async () => {
		const answer = await probe();
		return answer.ok && answer.status === 200;
	};

	const closeBreaker = () => {
		clearTimeout(probeTimer);
		probeTimer = undefined;
		backoff = cfg.backoffMs;
		const was = open;
		open = false;
		offerRecall(true);
		if (was && outageWarned) say(lastCtx, `sessionfold: server answers again at ${cfg.url}; pruning resumes`, "info");
		outageWarned = false;
	};

	const probeLater = () => {
		clearTimeout(probeTimer);
		probeTimer = setTimeout(async () => {
			probeTimer = undefined;
			if (!open) return;
			if (await alive()) return closeBreaker();
			backoff = Math.min(backoff * 2, cfg.backoffMaxMs);
			if (open && !probeTimer) probeLater();
		}, backoff);
		probeTimer.unref();
	};

	const openBreaker = () => {
		offerRecall(false);
		if (open) return;
		open = true;
		backoff = cfg.backoffMs;
		probeLater();
	};

	/** Counts one fall-back: a warning once per outage (or per route's bad answers), a best-effort
	 * report to a server that answers, and the breaker opened when it does not. */
	const failOpen = (ctx: ExtensionContext, kind: FailKind | "hung", what: string) => {
		const text = { unreachable: "server unreachable", hung: "server not answering", timeout: "server too slow", "bad-answer": "unexpected answer" };
		const route = what.split(" ")[0];
		const down = kind === "unreachable" || kind === "hung";
		const first = down || kind === "timeout" ? !outageWarned : !badWarned.has(route);
		if (first) {
			if (down || kind === "timeout") outageWarned = true;
			else badWarned.add(route);
			say(ctx, `sessionfold: ${text[kind]} (${what}) at ${cfg.url}; pi keeps its own context until it answers again`, "warning");
		}
		if (down) return openBreaker();
		const report = { fail_open: 1, kind: kind === "bad-answer" ? kind : "timeout" };
		void call(cfg, "POST", sessionPath(ctx, "client-events"), report, { timeoutMs: EVENT_TIMEOUT_MS, unref: true });
	};

	/** The answer's body when it is a 200 with a JSON object, else undefined after failing open. */
	const expect200 = (ctx: ExtensionContext, answer: Answer, what: string): Record<string, unknown> | undefined => {
		if (!answer.ok) {
			if (answer.kind !== "aborted") failOpen(ctx, answer.kind, what);
			return undefined;
		}
		if (answer.status !== 200 || !isObject(answer.body)) {
			failOpen(ctx, "bad-answer", `${what} status ${answer.status}`);
			return undefined;
		}
		return answer.body;
	};

	/** A good answer from `what`: its bad-answer warning may show again; an outage is over. */
	const answered = (what: string) => {
		badWarned.delete(what);
		if (open || outageWarned) closeBreaker();
		else offerRecall(true);
	};

	/** One call to a session route, bounded by the first byte (with liveness) and `timeoutMs`. */
	const ask = (ctx: ExtensionContext, method: "GET" | "POST", tail: string, body: unknown, timeoutMs: number, signal?: AbortSignal) => {
		lastCtx = ctx;
		return call(cfg, method, sessionPath(ctx, tail), body, {
			timeoutMs,
			signal,
			firstByteMs: cfg.firstByteMs,
			everyMs: cfg.probeEveryMs,
			alive,
		});
	};

	pi.on("session_start", async (_event, ctx) => {
		lastCtx = ctx;
		if (registered || observeOnly) return;
		if (pi.getAllTools().some((tool) => tool.name === RECALL_TOOL)) {
			observeOnly = true;
			return;
		}
		registered = true;
		pi.registerTool({
			name: RECALL_TOOL,
			label: "Context tree query",
			description:
				"Retrieve the full original output of tool results that were summarized out of the context. " +
				'Pass the refs named in the summaries and stubs, e.g. ["t12","t3"], or raw tool call ids.',
			promptSnippet: "Retrieve summarized tool outputs by ref (t12) or tool call id",
			promptGuidelines: ["Use context_tree_query when a stub says an output was summarized and you need it verbatim."],
			parameters: Type.Object({
				toolCallIds: Type.Array(Type.String(), { description: "Refs (t12) or raw tool call ids" }),
			}),
			async execute(_toolCallId, params, signal, _onUpdate, toolCtx) {
				const answer = open
					? ({ ok: false, kind: "aborted" } as const)
					: await ask(toolCtx, "POST", "recall", { ids: params.toolCallIds }, RECALL_TIMEOUT_MS, signal);
				const body = expect200(toolCtx, answer, "recall");
				if (!body || typeof body.text !== "string") {
					if (body) failOpen(toolCtx, "bad-answer", "recall");
					// A thrown error becomes an error result for the model; the turn goes on.
					throw new Error("sessionfold recall is unavailable right now");
				}
				answered("recall");
				return { content: [{ type: "text", text: body.text }], details: { found: body.found } };
			},
		});
		// Offered only once the server answers: out of the active set until `/health` says so.
		try {
			toolWanted = pi.getActiveTools().includes(RECALL_TOOL);
		} catch {
			toolWanted = true;
		}
		// pi waits for this probe (500 ms at most, a few ms from a live server), so the first model
		// call already has the tool, or a hung server's breaker is open before it.
		offerRecall(false);
		const answer = await probe(false);
		if (answer.ok && answer.status === 200) {
			if (open) closeBreaker();
			else offerRecall(true);
		} else if (!answer.ok && answer.kind !== "bad-answer") {
			failOpen(ctx, answer.kind === "unreachable" ? "unreachable" : "hung", "health");
		}
	});

	pi.on("session_shutdown", () => {
		clearTimeout(probeTimer);
		probeTimer = undefined;
	});

	pi.on("context", async (event, ctx) => {
		// An ephemeral session (--no-session) has no file for the server to fold, and pi writes a
		// new session's file only after its first model call: until then there is nothing to ask.
		const file = ctx.sessionManager.getSessionFile();
		if (observeOnly || open || !file || !existsSync(file)) return undefined;
		// `sessionFile`: a session outside serve's watched folders (pi --session-dir) is tailed
		// once it is under an allowed root, instead of answering "not-watched" for good.
		const request = {
			leaf: ctx.sessionManager.getLeafId() ?? null,
			...arrayOf(event.messages),
			answer: "patch",
			wait_ms: cfg.waitMs,
			sessionFile: resolve(file),
		};
		const answer = await ask(ctx, "POST", "context", request, cfg.timeoutMs, ctx.signal);
		const body = expect200(ctx, answer, "context");
		if (!body) return undefined;
		const messages = acceptedMessages(body, event.messages);
		if (messages === "bad") {
			failOpen(ctx, "bad-answer", "context");
			return undefined;
		}
		answered("context");
		// Unchanged: return nothing, so pi's own array (and the prompt-cache prefix) stays as is.
		return messages === undefined ? undefined : { messages: messages as typeof event.messages };
	});

	pi.on("session_before_compact", async (event, ctx) => {
		if (observeOnly || open) return undefined;
		const { preparation } = event;
		const request = {
			first_kept_entry_id: preparation.firstKeptEntryId ?? null,
			tokens_before: preparation.tokensBefore ?? null,
			leaf: ctx.sessionManager.getLeafId() ?? null,
		};
		// The pass may take long with a real ledger model, but only while the server answers
		// `/health`: a hung one ends the call past the first-byte bound and one probe.
		const answer = await ask(ctx, "POST", "compact", request, COMPACT_TIMEOUT_MS, event.signal);
		const body = expect200(ctx, answer, "compact");
		if (!body) return undefined;
		answered("compact");
		if (body.status === "fallback") return undefined;
		if (body.status !== "summary" || typeof body.summary !== "string") {
			failOpen(ctx, "bad-answer", "compact");
			return undefined;
		}
		// The details go in as the server wrote them: their `producer` tells the ledger fold that
		// this compaction is its own pass. The span record follows once pi has stored it.
		spanRecord = isObject(body.span_record) ? body.span_record : undefined;
		return {
			compaction: {
				summary: body.summary,
				firstKeptEntryId: preparation.firstKeptEntryId,
				tokensBefore: preparation.tokensBefore,
				details: isObject(body.details) ? body.details : {},
			},
		};
	});

	// Longhaul's order: pi's compaction entry, then the pass's span record as a custom entry
	// (never sent to the model), so a replay of the file folds the ledger the pass left.
	pi.on("session_compact", (event) => {
		const record = spanRecord;
		spanRecord = undefined;
		if (!record || !event.fromExtension) return;
		if (typeof record.customType === "string") pi.appendEntry(record.customType, record.data);
	});

	/** Refreshes the footer in the background: cosmetic, so it never delays a turn. The status is
	 * asked at pi's leaf: the server answers once it has folded the leaf (and the flush it set
	 * off), so the footer shows the state the turn left, not the one before. A refresh asked
	 * while one is out runs after it (agent_end right after turn_end), never dropped. */
	const refreshFooter = async (ctx: ExtensionContext) => {
		if (!ctx.hasUI) return;
		if (footerBusy) {
			footerAgain = true;
			return;
		}
		footerBusy = true;
		try {
			do {
				footerAgain = false;
				if (open) {
					ctx.ui.setStatus(STATUS_KEY, undefined);
					continue;
				}
				const leaf = ctx.sessionManager.getLeafId();
				const query = leaf ? `?leaf=${encodeURIComponent(leaf)}&wait_ms=${STATUS_WAIT_MS}` : "";
				const answer = await ask(ctx, "GET", `status${query}`, undefined, STATUS_TIMEOUT_MS);
				const body = expect200(ctx, answer, "status");
				if (body) answered("status");
				ctx.ui.setStatus(STATUS_KEY, body && typeof body.footer === "string" && body.footer ? body.footer : undefined);
			} while (footerAgain);
		} finally {
			footerBusy = false;
		}
	};
	pi.on("turn_end", (_event, ctx) => {
		void refreshFooter(ctx);
	});
	pi.on("agent_end", (_event, ctx) => {
		void refreshFooter(ctx);
	});
}
