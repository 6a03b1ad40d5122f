// Written by cohort-runner into the run directory and loaded with -e by a step whose agent
// declares a supervisor tool. It registers the declared ones (COHORT_SUPERVISOR_TOOLS):
// pi-subagents' "contact_supervisor" and pi-cohort's "intercom". A request that waits for an
// answer is an input dialog titled "cohort-supervisor:<reason>"; in RPC mode the runner
// records it in the run and answers it with the supervisor's reply (cohort-spawn --reply).
// A progress update is a notification and waits for nothing. Nobody answering within
// COHORT_REPLY_TIMEOUT_MS ms resolves the dialog empty, and the tool says so.
const MARK = "cohort-supervisor:";
const TOOLS = new Set((process.env.COHORT_SUPERVISOR_TOOLS ?? "").split(",").filter(Boolean));
const BOUND = Number(process.env.COHORT_REPLY_TIMEOUT_MS);
const TIMEOUT_MS = Number.isFinite(BOUND) && BOUND > 0 ? BOUND : 600000;
const MAX_BYTES = 65536;

function result(text: string, details: Record<string, unknown> = {}) {
  return { content: [{ type: "text", text }], details };
}

function checked(message: unknown): string {
  const text = typeof message === "string" ? message.trim() : "";
  if (!text) throw new Error("message is required: say what you need from the supervisor");
  if (Buffer.byteLength(text, "utf8") > MAX_BYTES) {
    throw new Error("message is over 64 KiB: say it shorter");
  }
  return text;
}

async function ask(ctx: any, signal: AbortSignal | undefined, reason: string, message: string) {
  const answer = await ctx.ui.input(MARK + reason, message, { timeout: TIMEOUT_MS, signal });
  if (typeof answer !== "string" || answer.length === 0) {
    const secs = Math.round(TIMEOUT_MS / 1000);
    return result(
      `No answer came from the supervisor within ${secs} s. Go on with your best judgement, ` +
        "and say in your final answer what you decided without them and why.",
      { reason, answered: false },
    );
  }
  return result("Reply from supervisor:\n" + answer, { reason, answered: true });
}

function tell(ctx: any, message: string) {
  ctx.ui.notify(MARK + "progress_update\n" + message, "info");
  return result("Progress update sent to the supervisor.", { reason: "progress_update" });
}

export default function (pi: any) {
  if (TOOLS.has("contact_supervisor")) {
    pi.registerTool({
      name: "contact_supervisor",
      label: "Contact supervisor",
      description:
        "Reach the supervisor of this run. reason need_decision: a decision you should not " +
        "make alone (waits for the reply); interview_request: structured input you need " +
        "(waits); progress_update: news that changes the plan (does not wait).",
      parameters: {
        type: "object",
        properties: {
          reason: { type: "string", enum: ["need_decision", "interview_request", "progress_update"] },
          message: { type: "string" },
          interview: { type: "object", additionalProperties: true },
        },
        required: ["reason"],
      },
      async execute(_id: string, params: any, signal: AbortSignal, _onUpdate: unknown, ctx: any) {
        const reason = String(params?.reason ?? "");
        if (reason === "progress_update") return tell(ctx, checked(params.message));
        if (reason !== "need_decision" && reason !== "interview_request") {
          throw new Error("reason must be need_decision, interview_request or progress_update");
        }
        let message = typeof params?.message === "string" ? params.message.trim() : "";
        if (reason === "interview_request" && params?.interview !== undefined) {
          message = (message ? message + "\n\n" : "") + "Interview: " + JSON.stringify(params.interview);
        }
        return ask(ctx, signal, reason, checked(message));
      },
    });
  }
  if (TOOLS.has("intercom")) {
    pi.registerTool({
      name: "intercom",
      label: "Intercom",
      description:
        "Talk to the supervisor of this run. action ask: a question, waits for the reply; " +
        "send: a message, does not wait; list or status: who can be reached.",
      parameters: {
        type: "object",
        properties: {
          action: { type: "string", enum: ["ask", "send", "list", "status", "pending", "reply"] },
          to: { type: "string" },
          message: { type: "string" },
          replyTo: { type: "string" },
        },
        required: ["action"],
      },
      async execute(_id: string, params: any, signal: AbortSignal, _onUpdate: unknown, ctx: any) {
        switch (params?.action) {
          case "ask":
            return ask(ctx, signal, "ask", checked(params.message));
          case "send":
            return tell(ctx, checked(params.message));
          case "list":
          case "status":
            return result(
              "The supervisor of this run is reachable: use ask to wait for an answer, send to tell.",
            );
          case "pending":
          case "reply":
            return result("Nothing waits for your reply: only the supervisor answers here.");
          default:
            throw new Error("action must be ask, send, list, status, pending or reply");
        }
      },
    });
  }
}
