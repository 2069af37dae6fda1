-- Sinks scoped to agents, private addresses allowed per sink, a secret's rotation overlap; the
-- outbox keeps each message's key apart from its webhook-id, which now names its actor.
--
-- The two outbox checks are added NOT VALID: the rows already there satisfy both (every old
-- webhook_id passed the stricter 256-character check, every key is null), and validating would
-- scan the whole outbox, delivered history included, under an exclusive lock.
ALTER TABLE "corral"."outbox" DROP CONSTRAINT "outbox_webhook_id";--> statement-breakpoint
ALTER TABLE "corral"."outbox" ADD COLUMN "key" text;--> statement-breakpoint
ALTER TABLE "corral"."sinks" ADD COLUMN "agents" text[];--> statement-breakpoint
ALTER TABLE "corral"."sinks" ADD COLUMN "allow_private" boolean DEFAULT false NOT NULL;--> statement-breakpoint
ALTER TABLE "corral"."sinks" ADD COLUMN "previous_secret" text;--> statement-breakpoint
ALTER TABLE "corral"."sinks" ADD COLUMN "previous_secret_until" timestamp with time zone;--> statement-breakpoint
ALTER TABLE "corral"."outbox" ADD CONSTRAINT "outbox_key" CHECK (key is null or (char_length(key) between 1 and 256 and key ~ '^[\x21-\x7e]+$')) NOT VALID;--> statement-breakpoint
ALTER TABLE "corral"."outbox" ADD CONSTRAINT "outbox_webhook_id" CHECK (char_length(webhook_id) between 1 and 520 and webhook_id ~ '^[\x21-\x7e]+$') NOT VALID;--> statement-breakpoint
ALTER TABLE "corral"."sinks" ADD CONSTRAINT "sinks_agents" CHECK (agents is null or cardinality(agents) between 1 and 64);--> statement-breakpoint
ALTER TABLE "corral"."sinks" ADD CONSTRAINT "sinks_previous_secret" CHECK (previous_secret is null or previous_secret ~ '^whsec_[A-Za-z0-9+/]+={0,2}$');--> statement-breakpoint
ALTER TABLE "corral"."sinks" ADD CONSTRAINT "sinks_previous_secret_until" CHECK ((previous_secret is null) = (previous_secret_until is null));