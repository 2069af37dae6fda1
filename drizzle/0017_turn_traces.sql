-- The outbox keeps the W3C trace context of the turn that wrote each message, sent with it as
-- `traceparent`/`tracestate`. The checks are added NOT VALID: every row already there has
-- neither, and validating would scan the whole outbox, delivered history included.
ALTER TABLE "corral"."outbox" ADD COLUMN "traceparent" text;--> statement-breakpoint
ALTER TABLE "corral"."outbox" ADD COLUMN "tracestate" text;--> statement-breakpoint
ALTER TABLE "corral"."outbox" ADD CONSTRAINT "outbox_traceparent" CHECK (traceparent is null or traceparent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$') NOT VALID;--> statement-breakpoint
ALTER TABLE "corral"."outbox" ADD CONSTRAINT "outbox_tracestate" CHECK (tracestate is null or (traceparent is not null and char_length(tracestate) <= 512 and tracestate ~ '^[\x20-\x7e]*$')) NOT VALID;