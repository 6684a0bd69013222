/**
 * Test-only pi extension, loaded BEFORE sessionfold's (run-pi.mjs --extension-first): at the start
 * of every `context` event it records the leaf and the session file as they were when pi asked,
 * before any handler awaited anything (pi may write to the session while a handler awaits).
 * probe-extension.ts, loaded after sessionfold's, records the array the handlers left.
 * Env: SESSIONFOLD_PROBE_RECORD, a JSONL file (lines with `hook: "context-start"`).
 */
import { appendFileSync, existsSync, readFileSync } from "node:fs";
import type { ExtensionAPI } from "@earendil-works/pi-coding-agent";

export default function (pi: ExtensionAPI) {
	const out = process.env.SESSIONFOLD_PROBE_RECORD;
	pi.on("context", (_event, ctx) => {
		const file = ctx.sessionManager.getSessionFile();
		const exists = !!file && existsSync(file);
		const lines = exists ? readFileSync(file!, "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l)) : [];
		const line = { hook: "context-start", leaf: ctx.sessionManager.getLeafId(), fileExists: exists, fileEntries: lines };
		if (out) appendFileSync(out, `${JSON.stringify(line)}\n`);
		return undefined;
	});
}
