// How a resource's or a job's status reads: "ok" (settled, done), "info" (on its way), "warn",
// "bad". Every kind's settled statuses (a server's running, a volume's available and attached, an
// address's or load balancer's active, a cluster's running) are "ok": a page says "ready" only
// for those (and a stopped server), once no job of the resource is still on its way.
export const STATUS_CLASS = {
  running: "ok", succeeded: "ok", healthy: "ok", active: "ok", assigned: "ok", done: "ok", ready: "ok",
  available: "ok", attached: "ok",
  creating: "info", pending: "info", updating: "info", configuring: "info",
  retry: "warn", deleting: "warn", destroying: "warn", degraded: "warn", stopped: "warn", unknown: "warn", skipped: "",
  failed: "bad", deleted: "", unhealthy: "bad",
};

// Whether a resource in `status` is settled (what "ready" needs besides no job on its way).
export const settled = (status) => STATUS_CLASS[status] === "ok" || status === "stopped";
