/**
 * Test-only pi extension: on every `context` event it records what was on disk at that moment
 * (does the session file exist, how many lines, is the leaf entry written) beside the event's
 * messages, and it records the compaction hooks. e2e.test.ts asserts pi's behaviour from this
 * (README.md "What pi does, measured"). Env: SESSIONFOLD_PROBE_RECORD, a JSONL file.
 */
import { appendFileSync, existsSync, readFileSync } from "node:fs";
import type { ExtensionAPI, ExtensionContext } from "@earendil-works/pi-coding-agent";

/** The session file and the leaf as they are now (probe-start.ts records them too). */
export function disk(ctx: ExtensionContext) {
	const file = ctx.sessionManager.getSessionFile();
	const exists = !!file && existsSync(file);
	const lines = exists ? readFileSync(file!, "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l)) : [];
	const leaf = ctx.sessionManager.getLeafId();
	return { file, exists, lines, leaf, leafOnDisk: lines.some((e) => e.id === leaf) };
}

export default function (pi: ExtensionAPI) {
	const out = process.env.SESSIONFOLD_PROBE_RECORD;
	const write = (line: Record<string, unknown>) => {
		if (out) appendFileSync(out, `${JSON.stringify(line)}\n`);
	};
	pi.on("context", (event, ctx) => {
		const d = disk(ctx);
		write({
			hook: "context",
			sessionId: ctx.sessionManager.getSessionId(),
			leaf: d.leaf,
			fileExists: d.exists,
			fileLines: d.lines.length,
			leafOnDisk: d.leafOnDisk,
			fileEntries: d.lines,
			messages: event.messages,
			mode: ctx.mode,
			hasUI: ctx.hasUI,
			tools: pi.getAllTools().map((t) => t.name),
		});
		return undefined;
	});
	pi.on("session_before_compact", (event, ctx) => {
		write({
			hook: "session_before_compact",
			reason: event.reason,
			firstKeptEntryId: event.preparation.firstKeptEntryId,
			tokensBefore: event.preparation.tokensBefore,
			leaf: ctx.sessionManager.getLeafId(),
			fileLines: disk(ctx).lines.length,
		});
		return undefined;
	});
	pi.on("session_compact", (event) => {
		write({ hook: "session_compact", fromExtension: event.fromExtension, entry: event.compactionEntry });
	});
}
