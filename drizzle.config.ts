import { defineConfig } from 'drizzle-kit';

// Generation needs no database; `db:migrate` applies migrations through corral itself so it works
// on the embedded PostgreSQL as well as on DATABASE_URL.
export default defineConfig({
  dialect: 'postgresql',
  schema: './src/db/schema.ts',
  out: './drizzle',
  schemaFilter: ['corral'],
  migrations: { schema: 'drizzle', table: 'corral_migrations' },
  dbCredentials: { url: process.env.DATABASE_URL ?? 'postgres://localhost/corral' },
});
