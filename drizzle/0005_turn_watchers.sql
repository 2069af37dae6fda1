CREATE TABLE "corral"."turn_watchers" (
	"channel" text NOT NULL,
	"pid" integer NOT NULL,
	"registered_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "turn_watchers_channel_pid_pk" PRIMARY KEY("channel","pid")
);
