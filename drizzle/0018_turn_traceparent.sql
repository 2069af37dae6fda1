-- Each turn keeps the W3C traceparent of its attempt (the daemon's invoke_agent span when it
-- traces, else the event's own context), so `corral actor` and `corral turn` name its trace. The
-- check is added NOT VALID: the rows already there have none, and validating would scan them all.
ALTER TABLE "corral"."turns" ADD COLUMN "traceparent" text;--> statement-breakpoint
ALTER TABLE "corral"."turns" ADD CONSTRAINT "turns_traceparent" CHECK (traceparent is null or traceparent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$') NOT VALID;
