CREATE TABLE "corral"."idempotency_keys" (
	"agent_uid" text NOT NULL,
	"session_id" text NOT NULL,
	"key" text NOT NULL,
	"event_id" uuid NOT NULL,
	"data_sha256" text NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "idempotency_keys_agent_uid_session_id_key_pk" PRIMARY KEY("agent_uid","session_id","key"),
	CONSTRAINT "idempotency_keys_key_length" CHECK (char_length(key) between 1 and 200)
);
--> statement-breakpoint
CREATE INDEX "idempotency_keys_created" ON "corral"."idempotency_keys" USING btree ("created_at");