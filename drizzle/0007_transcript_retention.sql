CREATE TABLE "corral"."transcript_retention" (
	"agent_uid" text PRIMARY KEY NOT NULL,
	"keep_seconds" integer NOT NULL,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "transcript_retention_keep_positive" CHECK ("corral"."transcript_retention"."keep_seconds" > 0),
	CONSTRAINT "transcript_retention_agent_uid" CHECK (agent_uid ~ '^[A-Za-z0-9._:@-]{1,128}$')
);
--> statement-breakpoint
ALTER TABLE "corral"."conversations" ADD COLUMN "pruned_through" integer DEFAULT 0 NOT NULL;--> statement-breakpoint
CREATE INDEX IF NOT EXISTS "turns_finished" ON "corral"."turns" USING btree ("conversation_id","finished_at") WHERE status in ('succeeded', 'failed', 'cancelled');