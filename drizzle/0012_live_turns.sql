CREATE TABLE "corral"."api_tokens" (
	"name" text PRIMARY KEY NOT NULL,
	"token_sha256" text NOT NULL,
	"scopes" text[] NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"last_used_at" timestamp with time zone,
	"revoked_at" timestamp with time zone,
	CONSTRAINT "api_tokens_name" CHECK (name ~ '^[A-Za-z0-9._-]{1,64}$'),
	CONSTRAINT "api_tokens_scopes" CHECK (cardinality(scopes) >= 1 and scopes <@ array['read', 'send']::text[])
);
--> statement-breakpoint
CREATE UNLOGGED TABLE "corral"."stream_chunks" (
	"delivery_id" uuid NOT NULL,
	"seq" integer NOT NULL,
	"agent_uid" text NOT NULL,
	"session_id" text NOT NULL,
	"actor_epoch" integer NOT NULL,
	"attempt" integer NOT NULL,
	"data" jsonb NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "stream_chunks_delivery_id_seq_pk" PRIMARY KEY("delivery_id","seq"),
	CONSTRAINT "stream_chunks_seq" CHECK ("corral"."stream_chunks"."seq" >= 1)
);
--> statement-breakpoint
CREATE UNIQUE INDEX "api_tokens_sha256" ON "corral"."api_tokens" USING btree ("token_sha256");