CREATE TABLE "corral"."shard_emits" (
	"id" bigserial PRIMARY KEY NOT NULL,
	"target_shard" integer NOT NULL,
	"event_id" uuid NOT NULL,
	"agent_uid" text NOT NULL,
	"session_id" text NOT NULL,
	"data" jsonb NOT NULL,
	"delay_ms" integer,
	"attempts" integer DEFAULT 0 NOT NULL,
	"last_error" text,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "shard_emits_event_id_unique" UNIQUE("event_id"),
	CONSTRAINT "shard_emits_target_shard" CHECK ("corral"."shard_emits"."target_shard" between 0 and 1023),
	CONSTRAINT "shard_emits_delay" CHECK ("corral"."shard_emits"."delay_ms" is null or "corral"."shard_emits"."delay_ms" >= 0)
);
--> statement-breakpoint
CREATE TABLE "corral"."shard_inbox" (
	"event_id" uuid PRIMARY KEY NOT NULL,
	"source_shard" integer NOT NULL,
	"received_at" timestamp with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
CREATE INDEX "shard_emits_target" ON "corral"."shard_emits" USING btree ("target_shard","id");--> statement-breakpoint
CREATE INDEX "shard_inbox_received" ON "corral"."shard_inbox" USING btree ("received_at");