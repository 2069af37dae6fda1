ALTER TABLE "corral"."turns" DROP CONSTRAINT "turns_status";--> statement-breakpoint
ALTER TABLE "corral"."deliveries" ADD COLUMN "coalesced" uuid[];--> statement-breakpoint
ALTER TABLE "corral"."input_policies" ADD COLUMN "debounce_ms" integer;--> statement-breakpoint
ALTER TABLE "corral"."input_policies" ADD COLUMN "max_wait_ms" integer;--> statement-breakpoint
ALTER TABLE "corral"."input_policies" ADD COLUMN "max_events" integer;--> statement-breakpoint
ALTER TABLE "corral"."input_policies" ADD COLUMN "max_bytes" integer;--> statement-breakpoint
ALTER TABLE "corral"."turns" ADD COLUMN "coalesced" jsonb;--> statement-breakpoint
CREATE INDEX IF NOT EXISTS "turns_ended" ON "corral"."turns" USING btree ("conversation_id","finished_at") WHERE status in ('succeeded', 'failed', 'cancelled', 'interrupted');--> statement-breakpoint
CREATE INDEX IF NOT EXISTS "turns_coalesced_succeeded" ON "corral"."turns" USING gin ("coalesced" jsonb_path_ops) WHERE status = 'succeeded' and coalesced is not null;--> statement-breakpoint
DROP INDEX IF EXISTS "corral"."turns_finished";--> statement-breakpoint
ALTER TABLE "corral"."input_policies" ADD CONSTRAINT "input_policies_debounce" CHECK (debounce_ms between 1 and 3600000);--> statement-breakpoint
ALTER TABLE "corral"."input_policies" ADD CONSTRAINT "input_policies_max_wait" CHECK (max_wait_ms between 1 and 3600000 and max_wait_ms >= coalesce(debounce_ms, 0));--> statement-breakpoint
ALTER TABLE "corral"."input_policies" ADD CONSTRAINT "input_policies_max_events" CHECK (max_events between 1 and 100);--> statement-breakpoint
ALTER TABLE "corral"."input_policies" ADD CONSTRAINT "input_policies_max_bytes" CHECK (max_bytes > 0);--> statement-breakpoint
ALTER TABLE "corral"."input_policies" ADD CONSTRAINT "input_policies_batching" CHECK (policy in ('coalesce', 'interrupt') or (debounce_ms is null and max_wait_ms is null and max_events is null and max_bytes is null));--> statement-breakpoint
ALTER TABLE "corral"."turns" ADD CONSTRAINT "turns_status" CHECK (status in ('started', 'succeeded', 'failed', 'cancelled', 'interrupted'));