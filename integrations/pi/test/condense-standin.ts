/**
 * Test-only pi extension standing in for pi-condense: it registers `context_tree_query` at load,
 * as pi-condense does, so that e2e.test.ts can check that sessionfold then only observes.
 */
import type { ExtensionAPI } from "@earendil-works/pi-coding-agent";
import { Type } from "typebox";

export default function (pi: ExtensionAPI) {
	pi.registerTool({
		name: "context_tree_query",
		label: "stand-in",
		description: "pi-condense's recall tool, stood in for",
		parameters: Type.Object({ toolCallIds: Type.Array(Type.String()) }),
		async execute() {
			return { content: [{ type: "text", text: "stand-in" }], details: {} };
		},
	});
}
