/**
 * sessionfold-pi: a pi extension that asks a local `sessionfold serve` for the context the model
 * should see on every LLM call, for compaction summaries, for recalls and for the footer line.
 *
 * It knows no pruning rule: the server renders everything. It fails open: when the server is
 * unreachable, slow past the bound, or answers something unexpected, pi keeps its own messages and
 * its own compaction, the user gets one warning per kind of failure, and no turn ever fails.
 * It speaks the live-loop HTTP contract of `sessionfold serve` (see README.md beside this file).
 *
 * Env: SESSIONFOLD_URL (default http://127.0.0.1:6068), SESSIONFOLD_API_TOKEN (Bearer),
 * SESSIONFOLD_TIMEOUT_MS (bound of one context call, default 32000; the server is asked to wait
 * a little less, so that it answers, stale if need be, before the bound).
 */
import { existsSync } from "node:fs";
import { request as httpRequest } from "node:http";
import { request as httpsRequest } from "node:https";
import type { ExtensionAPI, ExtensionContext } from "@earendil-works/pi-coding-agent";
import { Type } from "typebox";

/** The recall tool's name: the stubs the server renders tell the model to call it. */
export const RECALL_TOOL = "context_tree_query";
const STATUS_KEY = "sessionfold";
const STATUS_TIMEOUT_MS = 2000;
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
}

/** The configuration from the environment. */
export function readConfig(env: NodeJS.ProcessEnv = process.env): Config {
	const raw = Number(env.SESSIONFOLD_TIMEOUT_MS);
	const timeoutMs = Number.isFinite(raw) && raw > 0 ? Math.floor(raw) : 32000;
	const margin = Math.min(2000, Math.floor(timeoutMs / 4));
	return {
		url: (env.SESSIONFOLD_URL || "http://127.0.0.1:6068").replace(/\/+$/, ""),
		token: env.SESSIONFOLD_API_TOKEN || undefined,
		timeoutMs,
		waitMs: timeoutMs - margin,
	};
}

type Answer = { ok: true; status: number; body: unknown } | { ok: false; kind: FailKind | "aborted" };

/** One JSON request, bounded by timeoutMs and the caller's signal; never throws. */
export function call(
	cfg: Config,
	method: "GET" | "POST",
	path: string,
	body: unknown,
	timeoutMs: number,
	signal?: AbortSignal,
): Promise<Answer> {
	return new Promise((resolve) => {
		if (signal?.aborted) return resolve({ ok: false, kind: "aborted" });
		const url = new URL(cfg.url + path);
		const payload = body === undefined ? undefined : JSON.stringify(body);
		const headers: Record<string, string> = { accept: "application/json" };
		if (payload !== undefined) headers["content-type"] = "application/json";
		if (cfg.token) headers.authorization = `Bearer ${cfg.token}`;
		let settled = false;
		const finish = (answer: Answer) => {
			if (settled) return;
			settled = true;
			clearTimeout(timer);
			signal?.removeEventListener("abort", onAbort);
			req.destroy();
			resolve(answer);
		};
		const onAbort = () => finish({ ok: false, kind: "aborted" });
		const send = url.protocol === "https:" ? httpsRequest : httpRequest;
		const req = send(url, { method, headers }, (res) => {
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
		// The bound covers connecting, the server's wait and reading the whole body.
		const timer = setTimeout(() => finish({ ok: false, kind: "timeout" }), timeoutMs);
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
	const warned = new Set<string>();
	// Observe-only when another extension (pi-condense) owns the recall tool: two renderers of
	// one context would fight, so then sessionfold only shows its footer.
	let observeOnly = false;
	let registered = false;
	let footerBusy = false;
	// The span record of the compaction this extension supplied, until pi has stored it.
	let spanRecord: Record<string, unknown> | undefined;

	const sessionPath = (ctx: ExtensionContext, tail: string) =>
		`/sessions/${encodeURIComponent(ctx.sessionManager.getSessionId())}/${tail}`;

	const warn = (ctx: ExtensionContext, kind: string, text: string) => {
		if (warned.has(kind)) return;
		warned.add(kind);
		const line = `sessionfold: ${text} at ${cfg.url}; pi keeps its own context (shown once)`;
		if (ctx.hasUI) ctx.ui.notify(line, "warning");
		else console.warn(line);
	};

	/** Counts one fall-back: a warning once per kind, and a best-effort report to the server. */
	const failOpen = (ctx: ExtensionContext, kind: FailKind, what: string) => {
		const text = { unreachable: "server unreachable", timeout: "server too slow", "bad-answer": "unexpected answer" };
		warn(ctx, kind, `${text[kind]} (${what})`);
		void call(cfg, "POST", sessionPath(ctx, "client-events"), { fail_open: 1, kind }, EVENT_TIMEOUT_MS);
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

	pi.on("session_start", () => {
		if (registered) return;
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
				const answer = await call(cfg, "POST", sessionPath(toolCtx, "recall"), { ids: params.toolCallIds }, RECALL_TIMEOUT_MS, signal);
				const body = expect200(toolCtx, answer, "recall");
				if (!body || typeof body.text !== "string") {
					if (body) failOpen(toolCtx, "bad-answer", "recall");
					// A thrown error becomes an error result for the model; the turn goes on.
					throw new Error("sessionfold recall is unavailable right now");
				}
				return { content: [{ type: "text", text: body.text }], details: { found: body.found } };
			},
		});
	});

	pi.on("context", async (event, ctx) => {
		// An ephemeral session (--no-session) has no file for the server to fold, and pi writes a
		// new session's file only after its first model call: until then there is nothing to ask.
		const file = ctx.sessionManager.getSessionFile();
		if (observeOnly || !file || !existsSync(file)) return undefined;
		const request = { leaf: ctx.sessionManager.getLeafId() ?? null, ...arrayOf(event.messages), answer: "patch", wait_ms: cfg.waitMs };
		const answer = await call(cfg, "POST", sessionPath(ctx, "context"), request, cfg.timeoutMs, ctx.signal);
		const body = expect200(ctx, answer, "context");
		if (!body) return undefined;
		const messages = acceptedMessages(body, event.messages);
		if (messages === "bad") {
			failOpen(ctx, "bad-answer", "context");
			return undefined;
		}
		// Unchanged: return nothing, so pi's own array (and the prompt-cache prefix) stays as is.
		return messages === undefined ? undefined : { messages: messages as typeof event.messages };
	});

	pi.on("session_before_compact", async (event, ctx) => {
		if (observeOnly) return undefined;
		const { preparation } = event;
		const request = {
			first_kept_entry_id: preparation.firstKeptEntryId ?? null,
			tokens_before: preparation.tokensBefore ?? null,
			leaf: ctx.sessionManager.getLeafId() ?? null,
		};
		const answer = await call(cfg, "POST", sessionPath(ctx, "compact"), request, COMPACT_TIMEOUT_MS, event.signal);
		const body = expect200(ctx, answer, "compact");
		if (!body || body.status === "fallback") return undefined;
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

	/** Refreshes the footer in the background: cosmetic, so it never delays a turn. */
	const refreshFooter = async (ctx: ExtensionContext) => {
		if (!ctx.hasUI || footerBusy) return;
		footerBusy = true;
		try {
			const answer = await call(cfg, "GET", sessionPath(ctx, "status"), undefined, STATUS_TIMEOUT_MS);
			const body = expect200(ctx, answer, "status");
			ctx.ui.setStatus(STATUS_KEY, body && typeof body.footer === "string" && body.footer ? body.footer : undefined);
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
