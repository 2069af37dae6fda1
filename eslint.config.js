// Lint: type-aware rules that catch what the type checker does not (a promise nobody awaits,
// an import that is only a type). `npm run lint`; part of `.ci/run`.
import tseslint from 'typescript-eslint';

const DRIZZLE = { group: ['drizzle-orm', 'drizzle-orm/*'], message: 'import Drizzle from src/db/orm.ts' };
const DRIZZLE_IMPORT = { selector: 'ImportExpression[source.value=/^drizzle-orm(\\/|$)/]', message: DRIZZLE.message };
const BOSS_DIST = { group: ['pg-boss/dist', 'pg-boss/dist/*'], message: "pg-boss's internals belong to src/db/boss/internals.ts" };
const BOSS_DIST_IMPORT = { selector: 'ImportExpression[source.value=/^pg-boss\\/dist(\\/|$)/]', message: BOSS_DIST.message };

export default tseslint.config(
  { ignores: ['node_modules/', 'drizzle/', 'coverage/', 'dist/', '.corral/'] },
  {
    files: ['**/*.ts'],
    languageOptions: {
      parser: tseslint.parser,
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
    },
    plugins: { '@typescript-eslint': tseslint.plugin },
    rules: {
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/no-misused-promises': ['error', { checksVoidReturn: false }],
      '@typescript-eslint/consistent-type-imports': ['error', { fixStyle: 'inline-type-imports' }],
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_', caughtErrors: 'none' }],
    },
  },
  {
    // Drizzle is loaded once, as CommonJS, by src/db/orm.ts (its ES-module build costs a command
    // ~400 ms of start-up, and two builds in one process would not share classes). pg-boss's
    // internals (`pg-boss/dist/*`) are used by src/db/boss/internals.ts alone, the module its
    // upgrade test checks; tests may import them to compare with pg-boss.
    files: ['**/*.ts'],
    ignores: ['src/db/orm.ts'],
    rules: {
      '@typescript-eslint/no-restricted-imports': ['error', { patterns: [DRIZZLE, BOSS_DIST] }],
      'no-restricted-syntax': ['error', DRIZZLE_IMPORT, BOSS_DIST_IMPORT],
    },
  },
  {
    files: ['src/db/boss/internals.ts', 'test/**/*.ts'],
    rules: {
      '@typescript-eslint/no-restricted-imports': ['error', { patterns: [DRIZZLE] }],
      'no-restricted-syntax': ['error', DRIZZLE_IMPORT],
    },
  },
);
