CREATE TABLE "corral"."sinks" (
	"name" text PRIMARY KEY NOT NULL,
	"url" text NOT NULL,
	"secret" text NOT NULL,
	"timeout_ms" integer DEFAULT 10000 NOT NULL,
	"concurrency" integer DEFAULT 4 NOT NULL,
	"disabled_at" timestamp with time zone,
	"disabled_reason" text,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "sinks_name" CHECK (name ~ '^[A-Za-z0-9._-]{1,64}$'),
	CONSTRAINT "sinks_url" CHECK (url ~ '^https?://' and char_length(url) <= 2048),
	CONSTRAINT "sinks_secret" CHECK (secret ~ '^whsec_[A-Za-z0-9+/]+={0,2}$'),
	CONSTRAINT "sinks_timeout" CHECK ("corral"."sinks"."timeout_ms" between 100 and 600000),
	CONSTRAINT "sinks_concurrency" CHECK ("corral"."sinks"."concurrency" between 1 and 64)
);
